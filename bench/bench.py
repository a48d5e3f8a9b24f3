"""pgworker against its peers (procrastinate, pgqueuer, chancy) and against the floor (raw
asyncpg, no library), on one PostgreSQL server. See bench/README.md for what each figure means.

    python bench/bench.py [--n 20000] [--runs 3] [--systems pgworker,procrastinate,...]
                          [--workloads w1,w2,w3,w4] [--profile]

Each system gets a fresh database per run (bench_<system>_<run>), dropped at the end; runs
alternate systems (run 1: every system in order, run 2: every system, ...). Everything started
here (workers, the paced producer, py-spy) is stopped and every database dropped on exit, on an
error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Run as `python bench/bench.py`, Python puts bench/ first on the path, where `import bench`
# would find this file instead of the package: import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(REPO))

import asyncpg  # noqa: E402

from bench.procstat import CpuMeter  # noqa: E402
from bench.systems import BIN, PEERS, SYSTEMS, System, imported_from  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
LIB_SYSTEMS = ("pgworker", "pgworker-durable", *PEERS, "pgqueuer-defaults")
BASE = "pgworker-base"  # pgworker from --base-src, only when asked for
WORKLOADS = ("w1", "w2", "w3", "w4")
POLL_S = 0.02  # completion poll
CPU_SAMPLE_S = 0.1  # /proc sample (interpolated at the interval's ends)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def with_db(dsn: str, db: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))


# --- what this run started, to be cleaned up whatever happens ---------------------------------


@dataclass
class Resources:
    admin_dsn: str
    keep_dbs: bool = False
    procs: dict[int, str] = field(default_factory=dict)  # pid -> what
    dbs: set[str] = field(default_factory=set)

    async def create_db(self, name: str) -> str:
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self.dbs.add(name)
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return with_db(self.admin_dsn, name)

    async def drop_db(self, name: str) -> None:
        if self.keep_dbs:
            return
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
        self.dbs.discard(name)

    def kill_all(self) -> None:
        for pid, what in list(self.procs.items()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each was started in a session of its own
                log(f"killed {what} (pid {pid})")
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            self.procs.pop(pid, None)

    def cleanup(self) -> None:
        self.kill_all()
        if self.dbs and not self.keep_dbs:

            async def drop_all() -> None:
                for name in list(self.dbs):
                    try:
                        await self.drop_db(name)
                        log(f"dropped database {name}")
                    except Exception as exc:  # best effort at exit
                        log(f"could not drop database {name}: {exc}")

            asyncio.run(drop_all())


def launch(
    res: Resources,
    argv: list[str],
    dsn: str,
    log_path: Path,
    extra_env: dict[str, str] | None,
    src: Path | None = None,
) -> subprocess.Popen:
    """Start `argv` in a session of its own, from this repository, or from the checkout `src`
    (its cwd and its only PYTHONPATH entry: `python -m pgworker` imports that checkout's)."""
    env = dict(os.environ)
    env.update(
        {
            "BENCH_DSN": dsn,
            "PYTHONPATH": str(src) if src else str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra_env or {})
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=src or REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    res.procs[proc.pid] = f"{Path(argv[0]).name} {' '.join(argv[1:3])}"
    return proc


async def stop(res: Resources, proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM (graceful stop), then SIGKILL to its whole session after `grace` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # and anything it left behind
    with contextlib.suppress(Exception):
        proc.wait(5)
    res.procs.pop(proc.pid, None)


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class BenchError(RuntimeError):
    pass


# --- W1: bulk enqueue, then one worker drains ---------------------------------------------------


# Other work on the shared server during a drain (checked once a second): active backends of
# databases that are not this benchmark's, not counting those waiting on a lock or a client
# (e.g. a second benchmark waiting for this one's advisory lock), which use no CPU.
OTHERS_SQL = """
SELECT count(*) FROM pg_stat_activity
WHERE state = 'active' AND backend_type = 'client backend' AND datname NOT LIKE 'bench\\_%'
  AND pid <> pg_backend_pid() AND wait_event_type IS DISTINCT FROM 'Lock'
  AND wait_event_type IS DISTINCT FROM 'Client'
"""


def postmaster_of(conn: asyncpg.Connection) -> int | None:
    """The postmaster of the server behind `conn` when it runs on this machine (the parent of
    our backend), so that other PostgreSQL clusters on the machine are not counted."""
    from bench.procstat import parent

    pid = parent(conn.get_server_pid())
    if pid is None or pid <= 1:
        log("  note: the server is not a local process; counting every `postgres` process")
        return None
    return pid


def interp(samples: list[tuple[float, ...]], t: float, i: int) -> float:
    """Linear interpolation of column i of (time, worker, pg, self, machine) samples at t."""
    if t <= samples[0][0]:
        return samples[0][i]
    for a, b in itertools.pairwise(samples):
        if a[0] <= t <= b[0]:
            if b[0] == a[0]:
                return b[i]
            return a[i] + (b[i] - a[i]) * (t - a[0]) / (b[0] - a[0])
    return samples[-1][i]


async def drain(
    res: Resources,
    system: System,
    dsn: str,
    n: int,
    log_path: Path,
    timeout: float,
    on_started: Any = None,
) -> dict[str, Any]:
    """Start one worker on a table holding n pending jobs, wait until none is left, and return
    the processing rate and the CPU used between the first start and the last completion."""
    poll = await asyncpg.connect(dsn)
    try:
        meter = CpuMeter(postmaster=postmaster_of(poll), exclude={poll.get_server_pid()})
        since = time.time()
        proc = launch(res, system.worker_argv(dsn), dsn, log_path, None, system.src)
        meter.root = proc.pid
        samples = [(time.time(), *meter.sample())]
        last_sample = samples[0][0]
        last_noise, others = 0.0, 0
        deadline = time.monotonic() + timeout
        extra = None
        if on_started is not None:
            extra = asyncio.create_task(on_started(proc, dsn, meter.exclude))
        try:
            while True:
                if proc.poll() is not None:
                    raise BenchError(
                        f"{system.name} worker exited with {proc.returncode}:\n{tail(log_path)}"
                    )
                unfinished = await poll.fetchval(system.unfinished_sql)
                now = time.time()
                if now - last_noise >= 1.0:
                    others = max(others, await poll.fetchval(OTHERS_SQL))
                    last_noise = now
                if now - last_sample >= CPU_SAMPLE_S or not unfinished:
                    samples.append((now, *meter.sample()))
                    last_sample = now
                if not unfinished:
                    polled_end = now
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"{system.name}: drain of {n} jobs not done in {timeout}s")
                await asyncio.sleep(POLL_S)
            extra_result = await extra if extra is not None else None
            await asyncio.sleep(0.2)
            samples.append((time.time(), *meter.sample()))
            iv = await system.interval(poll, since)
        finally:
            if extra is not None and not extra.done():
                extra.cancel()
            await stop(res, proc)
    finally:
        await poll.close()
    if iv.start is None:
        raise BenchError(f"{system.name}: no start timestamp found")
    end = iv.end if (system.end_from_db and iv.end is not None) else polled_end
    span = end - iv.start
    worker_cpu, pg_cpu, self_cpu, busy = (
        interp(samples, end, i) - interp(samples, iv.start, i) for i in (1, 2, 3, 4)
    )
    # What else kept the machine's cores busy meanwhile (other programs, other clusters).
    other_cores = max(busy - worker_cpu - pg_cpu - self_cpu, 0.0) / span
    return {
        "processing_jps": n / span,
        "processing_s": span,
        "processing_jps_poll_end": n / (polled_end - iv.start),
        "worker_cpu_ms_per_1k": worker_cpu * 1e6 / n,
        "pg_cpu_ms_per_1k": pg_cpu * 1e6 / n,
        "interval_from": iv.how if system.end_from_db else "start: database; end: 20 ms poll",
        "other_active_backends_max": others,
        "bench_cpu_ms_per_1k": self_cpu * 1e6 / n,
        "other_cpu_cores": other_cores,
        "extra": extra_result,
    }


PGWORKER_CHECK = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE j.status = 'completed' AND a.n = 1 AND a.completed = 1) AS ok,
       coalesce(sum(a.n), 0)::bigint AS attempts
FROM pgworker.jobs AS j
LEFT JOIN (SELECT job_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'completed') AS completed
           FROM pgworker.job_attempts GROUP BY job_id) AS a ON a.job_id = j.id
WHERE j.id > $1
"""


async def pgworker_check(dsn: str, n: int, after_id: int = 0) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(PGWORKER_CHECK, after_id)
    finally:
        await conn.close()
    if row["jobs"] == n and row["ok"] == n and row["attempts"] == n:
        return f"ok: {n}/{n} jobs completed with exactly 1 completed attempt"
    return (
        f"FAIL: {row['ok']}/{n} jobs completed with exactly 1 completed attempt "
        f"(jobs {row['jobs']}, attempt rows {row['attempts']})"
    )


async def wait_quiet(args: argparse.Namespace) -> None:
    """Wait (at most --quiet-wait seconds) until the machine's cores are nearly idle over one
    second, so that another program's burst does not land in a measurement."""
    from bench.procstat import machine_busy

    deadline = time.monotonic() + args.quiet_wait
    said = False
    while True:
        b0, t0 = machine_busy(), time.monotonic()
        await asyncio.sleep(1.0)
        cores = (machine_busy() - b0) / (time.monotonic() - t0)
        if cores <= args.quiet_cores:
            return
        if time.monotonic() > deadline:
            log(f"  machine still busy ({cores:.2f} cores in use); measuring anyway")
            return
        if not said:
            log(f"  machine busy ({cores:.2f} cores in use by others): waiting for it to calm down")
            said = True


async def pgworker_statements(dsn: str, after_id: int = 0) -> dict[str, int]:
    """How many claim and outcome-write statements the drain took: each statement stamps its
    rows with one now(), so distinct timestamps count statements."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT count(DISTINCT claimed_at) AS c, count(DISTINCT finished_at) AS f "
            "FROM pgworker.jobs WHERE id > $1",
            after_id,
        )
    finally:
        await conn.close()
    return {"claim_statements": row["c"], "finish_statements": row["f"]}


async def w1(res: Resources, args: argparse.Namespace, system: System, dsn: str, tag: str) -> dict:
    await wait_quiet(args)
    enqueue_s = await system.enqueue_bulk(dsn, args.n, args.chunk)
    log(f"  {system.name}: enqueued {args.n} in {enqueue_s:.2f}s ({args.n / enqueue_s:,.0f}/s)")
    out = await drain(
        res, system, dsn, args.n, args.results / "logs" / f"{tag}-w1.log", args.timeout
    )
    out["enqueue_jps"] = args.n / enqueue_s
    out.pop("extra", None)
    if system.name.startswith("pgworker"):
        out["check"] = await pgworker_check(dsn, args.n)
        out.update(await pgworker_statements(dsn))
        claims = out["claim_statements"]
        log(
            f"  {system.name}: {claims} claims ({args.n / claims:.1f}"
            f" jobs each), {out['finish_statements']} outcome writes "
            f"({args.n / out['finish_statements']:.1f} jobs each)"
        )
    else:
        conn = await asyncpg.connect(dsn)
        try:
            done = await conn.fetchval(system.done_sql)
        finally:
            await conn.close()
        out["check"] = f"{'ok' if done == args.n else 'FAIL'}: {done}/{args.n} succeeded"
    log(
        f"  {system.name}: processed at {out['processing_jps']:,.0f}/s "
        f"(worker {out['worker_cpu_ms_per_1k']:.0f} ms/1k, "
        f"PostgreSQL {out['pg_cpu_ms_per_1k']:.0f} ms/1k; other programs "
        f"{out['other_cpu_cores']:.2f} cores)" + (f"; {out['check']}" if "check" in out else "")
    )
    return out


# --- W2: wake-up latency of an idle worker -------------------------------------------------------


def read_latencies(path: Path) -> list[tuple[float, float]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), float(parts[1])))
    return out


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def w2(res: Resources, args: argparse.Namespace, system: System, dsn: str, tag: str) -> dict:
    path = args.results / "tmp" / f"{tag}-latency.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    log_path = args.results / "logs" / f"{tag}-w2.log"
    await wait_quiet(args)
    proc = launch(res, system.latency_argv(dsn), dsn, log_path, {"BENCH_LATENCY_FILE": str(path)})
    handle = await system.open_single(dsn)
    try:
        # Ready = it has run a warm-up job; then it is left idle for a second.
        deadline = time.monotonic() + 60
        while not read_latencies(path):
            if proc.poll() is not None:
                raise BenchError(f"{system.name} worker exited:\n{tail(log_path)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{system.name}: worker not ready after 60s:\n{tail(log_path)}")
            await system.enqueue_one(handle, time.time())
            for _ in range(10):
                await asyncio.sleep(0.05)
                if read_latencies(path):
                    break
        await asyncio.sleep(1.0)
        begin = time.time()
        paced = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.paced",
            "--system",
            system.name,
            "--dsn",
            dsn,
            "--rate",
            str(args.rate),
            "--count",
            str(args.latency_count),
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        res.procs[paced.pid] = "bench.paced"
        try:
            out, _ = await asyncio.wait_for(
                paced.communicate(), args.latency_count / args.rate + 60
            )
        finally:
            if paced.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(paced.pid, signal.SIGKILL)
            res.procs.pop(paced.pid, None)
        if paced.returncode != 0:
            raise BenchError(f"{system.name}: paced producer failed:\n{out.decode()}")
        producer = json.loads(out.decode().strip().splitlines()[-1])
        deadline = time.monotonic() + 30
        while True:
            got = [lat for t, lat in read_latencies(path) if t >= begin]
            if len(got) >= args.latency_count or time.monotonic() > deadline:
                break
            if proc.poll() is not None:
                raise BenchError(f"{system.name} worker exited:\n{tail(log_path)}")
            await asyncio.sleep(0.1)
    finally:
        await system.close_single(handle)
        await stop(res, proc)
    if len(got) < args.latency_count:
        raise BenchError(f"{system.name}: only {len(got)}/{args.latency_count} latency jobs ran")
    ms = [x * 1000 for x in got]
    out = {
        "latency_p50_ms": percentile(ms, 50),
        "latency_p95_ms": percentile(ms, 95),
        "latency_p99_ms": percentile(ms, 99),
        "latency_max_ms": max(ms),
        "latency_jobs": len(ms),
        "producer_max_lag_s": producer["max_lag_s"],
    }
    log(
        f"  {system.name}: wake-up p50 {out['latency_p50_ms']:.1f} ms, "
        f"p95 {out['latency_p95_ms']:.1f} ms, p99 {out['latency_p99_ms']:.1f} ms"
    )
    return out


# --- W4: pgworker on a table grown to 1M finished jobs ------------------------------------------

PREFILL_JOBS = """
INSERT INTO pgworker.jobs (type, queue, payload, priority, status, retry_count, max_retries,
                           attempts, correlation_id, run_at, claimed_at, worker_id,
                           heartbeat_at, created_at, updated_at, finished_at)
SELECT 'noop', 'default', '{}', 0, 'completed', 0, 3, 1, md5(g::text), t, t, 'prefill',
       t, t, t + interval '5 ms', t + interval '5 ms'
FROM (SELECT g, now() - interval '7 days' + g * interval '500 ms' AS t
      FROM generate_series(1, $1::int) AS g) AS s
"""
PREFILL_ATTEMPTS = """
INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                   outcome, started_at, finished_at)
SELECT id, 1, type, queue, worker_id, correlation_id, 'completed', claimed_at, finished_at
FROM pgworker.jobs
"""

SCAN = re.compile(
    r"(Seq Scan|Index Scan(?: Backward)?|Index Only Scan(?: Backward)?|Bitmap Index Scan|"
    r"Bitmap Heap Scan)(?: using (\S+))? on (\S+)"
)


def claim_scans(plan: list[str]) -> list[str]:
    """The scans of the claim's `next` CTE (the candidate search), as 'Index Scan using X'."""
    found, inside, indent = [], False, 0
    for line in plan:
        stripped = line.lstrip()
        depth = len(line) - len(stripped)
        if stripped.startswith("CTE "):
            inside = stripped.startswith("CTE next")
            indent = depth
            continue
        if inside and depth <= indent and stripped:
            inside = False
        if inside:
            m = SCAN.search(line)
            if m:
                kind, index, rel = m.groups()
                found.append(f"{kind}{' using ' + index if index else ''} on {rel}")
    return found


async def explain_claim(dsn: str) -> dict[str, Any]:
    from pgworker import sql

    q = sql.queries("pgworker")["job_claim"]
    # queues, types, limit, worker id, lease, the types' max_retries, code version, commit mode.
    params = "'{default}', '{noop,latency}', 10, 'bench-explain', 30, '{3,3}', NULL, 'off'"
    conn = await asyncpg.connect(dsn)
    out: dict[str, Any] = {}
    try:
        await conn.execute(
            f"PREPARE bench_claim(text[], text[], int, text, float8, int[], text, text) AS {q}"
        )
        for mode in ("auto", "force_generic_plan"):
            tr = conn.transaction()
            await tr.start()
            try:
                await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                await conn.execute("SET LOCAL enable_bitmapscan = off")  # as the worker does
                rows = await conn.fetch(
                    f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim({params})"
                )
            finally:
                await tr.rollback()  # the claim really ran: undo it
            plan = [r[0] for r in rows]
            name = "custom plan" if mode == "auto" else "generic plan"
            out[name] = {"plan": plan, "scans": claim_scans(plan)}
    finally:
        await conn.close()
    return out


async def w4(res: Resources, args: argparse.Namespace, dsn: str, tag: str) -> dict:
    system = SYSTEMS["pgworker"]
    await system.setup(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await conn.execute(PREFILL_JOBS, args.growth_rows)
        await conn.execute(PREFILL_ATTEMPTS)
        await conn.execute("VACUUM ANALYZE pgworker.jobs")
        await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
        prefill_s = time.perf_counter() - t0
        max_id = await conn.fetchval("SELECT max(id) FROM pgworker.jobs")
        size = await conn.fetchval(
            "SELECT pg_size_pretty(pg_total_relation_size('pgworker.jobs') "
            "+ pg_total_relation_size('pgworker.job_attempts'))"
        )
    finally:
        await conn.close()
    log(f"  pgworker@{args.growth_rows:,}: prefilled in {prefill_s:.1f}s ({size})")
    await wait_quiet(args)
    enqueue_s = await system.enqueue_bulk(dsn, args.n, args.chunk)
    explain = await explain_claim(dsn)
    out = await drain(
        res, system, dsn, args.n, args.results / "logs" / f"{tag}-w4.log", args.timeout
    )
    out.pop("extra", None)
    out["enqueue_jps"] = args.n / enqueue_s
    out["check"] = await pgworker_check(dsn, args.n, after_id=max_id)
    out["prefill_s"] = prefill_s
    out["tables_size"] = size
    out["explain"] = explain
    log(
        f"  pgworker@{args.growth_rows:,}: processed at {out['processing_jps']:,.0f}/s; "
        f"claim scans: {explain['custom plan']['scans']}; {out['check']}"
    )
    return out


# --- py-spy on one pgworker drain ----------------------------------------------------------------


def summarise_raw(path: Path, top: int = 15) -> dict[str, Any]:
    """Own (leaf) and cumulative (anywhere on the stack, once per sample) shares of py-spy's
    collapsed stacks ("frame;frame;... count" per line)."""
    own: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += c
        own[frames[-1]] += c
        for f in set(frames):
            cum[f] += c

    def rows(counter: Counter[str], n: int = top) -> list[tuple[str, float]]:
        return [(f, 100.0 * c / total) for f, c in counter.most_common(n)]

    packages: Counter[str] = Counter()
    for f, c in own.items():
        packages[package_of(f)] += c
    mine = Counter({f: c for f, c in cum.items() if "(pgworker/" in f})
    return {
        "samples": total,
        "own": rows(own),
        "cumulative": rows(cum),
        "own_by_package": rows(packages, 12),
        "pgworker_cumulative": rows(mine, 20),
    }


def package_of(frame: str) -> str:
    """'func (asyncpg/connection.py)' -> 'asyncpg'; the standard library's modules by name."""
    m = re.search(r"\(([^)]*)\)\s*$", frame)
    path = m.group(1) if m else frame
    head = path.split("/")[0]
    return head.removesuffix(".py") if head else path


async def profile(res: Resources, args: argparse.Namespace) -> dict[str, Any]:
    system = SYSTEMS["pgworker"]
    db = "bench_pgworker_profile"
    dsn = await res.create_db(db)
    raw = args.results / "pyspy-pgworker.txt"
    raw.unlink(missing_ok=True)
    try:
        await system.setup(dsn)
        await system.enqueue_bulk(dsn, args.profile_n, args.chunk)
        await wait_quiet(args)

        async def record(proc: subprocess.Popen, dsn: str, exclude: set[int]) -> dict:
            # Attach once the worker is processing (imports and start-up left out).
            conn = await asyncpg.connect(dsn)
            exclude.add(conn.get_server_pid())
            try:
                while not await conn.fetchval(
                    "SELECT EXISTS (SELECT FROM pgworker.jobs WHERE status = 'completed')"
                ):
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()
            spy = await asyncio.create_subprocess_exec(
                str(BIN / "py-spy"),
                "record",
                "--pid",
                str(proc.pid),
                "--duration",
                str(args.profile_seconds),
                "--rate",
                "250",
                "--nonblocking",
                "--nolineno",
                "--format",
                "raw",
                "--output",
                str(raw),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            res.procs[spy.pid] = "py-spy"
            try:
                out, _ = await asyncio.wait_for(spy.communicate(), args.profile_seconds + 30)
            finally:
                res.procs.pop(spy.pid, None)
            return {"returncode": spy.returncode, "output": out.decode(errors="replace")[-2000:]}

        result = await drain(
            res,
            system,
            dsn,
            args.profile_n,
            args.results / "logs" / "profile-pgworker.log",
            args.timeout,
            on_started=record,
        )
    finally:
        await res.drop_db(db)
    spy = result.pop("extra") or {}
    if not raw.exists():
        raise BenchError(f"py-spy wrote nothing: {spy.get('output', '')}")
    summary = summarise_raw(raw)
    summary["processing_jps_while_sampled"] = result["processing_jps"]
    summary["py_spy"] = spy
    return summary


# --- the report ---------------------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


FIGURES = (
    "enqueue_jps",
    "processing_jps",
    "worker_cpu_ms_per_1k",
    "pg_cpu_ms_per_1k",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
)


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    rows: dict[str, dict[str, float | None]] = {}
    names: list[str] = []
    for r in runs:
        for name in r["systems"]:
            if name not in names:
                names.append(name)
    for name in names:
        per = [r["systems"][name] for r in runs if name in r["systems"]]
        rows[name] = {f: median([p.get(f) for p in per]) for f in FIGURES}
        checks = [p["check"] for p in per if "check" in p]
        if checks:
            bad = [c for c in checks if not c.startswith("ok")]
            rows[name]["check"] = bad[0] if bad else checks[0]  # type: ignore[assignment]
    return rows


def render(report: dict[str, Any]) -> str:
    cfg, med = report["config"], report["medians"]
    growth_label = f"pgworker on {cfg['growth_rows']:,} finished jobs (W4)"
    labels = {
        "floor": "floor: raw asyncpg, no library (W3; W2 floor, fast claims)",
        "pgworker-durable": "pgworker --durable-claims",
        "pgqueuer": "pgqueuer (concurrency 10)",
        "pgqueuer-defaults": "pgqueuer, own defaults (no concurrency cap)",
        "pgworker@growth": growth_label,
        BASE: f"pgworker-base (git {cfg.get('base_rev', '?')})",
    }
    head = (
        "| system | bulk enqueue jobs/s | processing jobs/s | worker CPU ms/1k | "
        "PostgreSQL CPU ms/1k | wake-up p50 / p95 / p99 ms | check |"
    )
    lines = [
        f"# pgworker benchmark — {report['finished_at']}",
        "",
        f"N = {cfg['n']:,} no-op jobs per drain, {cfg['runs']} run(s), medians shown; "
        f"one worker process at concurrency {cfg['concurrency']}; wake-up: "
        f"{cfg['latency_count']} jobs at {cfg['rate']:g}/s. Machine: {report['machine']}.",
        "",
        head,
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    order = [
        s for s in ("pgworker", BASE, *LIB_SYSTEMS[1:], "floor", "pgworker@growth") if s in med
    ]
    for name in order:
        m = med[name]
        lat = (
            "–"
            if m.get("latency_p50_ms") is None
            else f"{fmt(m['latency_p50_ms'], 1)} / {fmt(m['latency_p95_ms'], 1)} / "
            f"{fmt(m['latency_p99_ms'], 1)}"
        )
        proc = fmt(m["processing_jps"])
        w1 = med.get("pgworker", {}).get("processing_jps")
        if name == "pgworker@growth" and w1 and m.get("processing_jps"):
            proc += f" ({m['processing_jps'] / w1:.2f}× W1)"
        lines.append(
            f"| {labels.get(name, name)} | {fmt(m['enqueue_jps'])} | {proc} | "
            f"{fmt(m['worker_cpu_ms_per_1k'])} | {fmt(m['pg_cpu_ms_per_1k'])} | {lat} | "
            f"{m.get('check', '')} |"
        )
    lines.append("")
    lines += ratio_lines(med)
    lines += base_lines(report["runs"])
    lines.append("")
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    if cfg.get("pgqueuer_note"):
        lines.append("")
        lines.append(cfg["pgqueuer_note"])
    explain = report.get("explain")
    if explain:
        lines += ["", f"## pgworker's claim query on {cfg['growth_rows']:,} finished jobs", ""]
        for name, e in explain.items():
            verdict = ", ".join(e["scans"]) or "no scan found"
            lines.append(f"- {name}: {verdict}")
        for name, e in explain.items():
            lines += ["", f"{name} (EXPLAIN ANALYZE, rolled back):", "", "```"]
            lines += e["plan"]
            lines.append("```")
    prof = report.get("profile")
    if prof:
        lines += [
            "",
            f"## py-spy on the pgworker worker ({prof['samples']} samples while draining at "
            f"{prof['processing_jps_while_sampled']:,.0f} jobs/s; idle excluded)",
            "",
            "| own % | function | | cumulative % | function |",
            "|---:|---|---|---:|---|",
        ]
        for (f1, p1), (f2, p2) in zip(prof["own"], prof["cumulative"], strict=False):
            lines.append(f"| {p1:.1f} | `{f1}` | | {p2:.1f} | `{f2}` |")
        lines += ["", "Own time by package (the leaf frame's):", ""]
        lines += [f"- {pkg}: {p:.1f}%" for pkg, p in prof["own_by_package"]]
        lines += ["", "pgworker's own frames, cumulative:", ""]
        lines += [f"- {p:.1f}% `{f}`" for f, p in prof["pgworker_cumulative"]]
    return "\n".join(lines) + "\n"


def ratio_lines(med: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    pgw = med.get("pgworker") or {}
    peers = {p: med[p] for p in PEERS if p in med}
    if pgw and peers:

        def best(key: str, low: bool = False) -> tuple[str, float] | None:
            vals = [(p, m[key]) for p, m in peers.items() if m.get(key) is not None]
            if not vals:
                return None
            return (min if low else max)(vals, key=lambda x: x[1])

        for key, label in (("processing_jps", "processing"), ("enqueue_jps", "bulk enqueue")):
            b = best(key)
            if b and pgw.get(key):
                out.append(
                    f"- pgworker / best peer, {label}: {pgw[key] / b[1]:.2f}× "
                    f"({fmt(pgw[key])} vs {b[0]} {fmt(b[1])} jobs/s; higher is better)"
                )
        for key, label in (
            ("worker_cpu_ms_per_1k", "worker CPU"),
            ("pg_cpu_ms_per_1k", "PostgreSQL CPU"),
        ):
            b = best(key, low=True)
            if b and pgw.get(key) is not None and b[1]:
                out.append(
                    f"- pgworker / best peer, {label}: {pgw[key] / b[1]:.2f}× "
                    f"({fmt(pgw[key])} vs {b[0]} {fmt(b[1])} ms/1k jobs; lower is better)"
                )
        totals = {
            p: m["worker_cpu_ms_per_1k"] + m["pg_cpu_ms_per_1k"]
            for p, m in peers.items()
            if m.get("worker_cpu_ms_per_1k") is not None and m.get("pg_cpu_ms_per_1k") is not None
        }
        if totals and pgw.get("worker_cpu_ms_per_1k") is not None:
            p, v = min(totals.items(), key=lambda x: x[1])
            mine = pgw["worker_cpu_ms_per_1k"] + pgw["pg_cpu_ms_per_1k"]
            out.append(
                f"- pgworker / best peer, total CPU (worker + PostgreSQL): {mine / v:.2f}× "
                f"({fmt(mine)} vs {p} {fmt(v)} ms/1k jobs; lower is better)"
            )
        durable = med.get("pgworker-durable", {}).get("processing_jps")
        b = best("processing_jps")
        if durable and b:
            out.append(
                f"- pgworker --durable-claims / best peer, processing: {durable / b[1]:.2f}× "
                f"({fmt(durable)} vs {b[0]} {fmt(b[1])} jobs/s)"
            )
        uncapped = med.get("pgqueuer-defaults", {}).get("processing_jps")
        if uncapped and pgw.get("processing_jps"):
            out.append(
                f"- pgworker / pgqueuer with its own defaults (not at concurrency 10), "
                f"processing: {pgw['processing_jps'] / uncapped:.2f}× "
                f"({fmt(pgw['processing_jps'])} vs {fmt(uncapped)} jobs/s)"
            )
    f = med.get("floor", {})
    if pgw.get("processing_jps") and f.get("processing_jps"):
        out.append(
            f"- pgworker / floor, processing: {pgw['processing_jps'] / f['processing_jps']:.2f}× "
            f"({fmt(pgw['processing_jps'])} vs {fmt(f['processing_jps'])} jobs/s)"
        )
    if pgw and pgw.get("latency_p50_ms") and f.get("latency_p50_ms"):
        out.append(
            f"- wake-up p50 / p99, pgworker − floor: "
            f"{pgw['latency_p50_ms'] - f['latency_p50_ms']:+.1f} / "
            f"{pgw['latency_p99_ms'] - f['latency_p99_ms']:+.1f} ms "
            f"(the floor's {fmt(f['latency_p50_ms'], 1)} / {fmt(f['latency_p99_ms'], 1)} ms: a "
            f"durable insert and its NOTIFY, then one claim)"
        )
    g = med.get("pgworker@growth")
    if pgw.get("processing_jps") and g and g.get("processing_jps"):
        out.append(
            f"- pgworker on a grown table / fresh table, processing: "
            f"{g['processing_jps'] / pgw['processing_jps']:.2f}×"
        )
    return out


def base_lines(runs: list[dict[str, Any]]) -> list[str]:
    """pgworker against pgworker-base, each figure of each run as a ratio to that run's floor
    (W3), then the medians of those ratios and new / old."""
    figures = (
        ("processing_jps", "processing"),
        ("worker_cpu_ms_per_1k", "worker CPU/job"),
        ("pg_cpu_ms_per_1k", "PostgreSQL CPU/job"),
    )
    per: dict[str, dict[str, list[float]]] = {"pgworker": {}, BASE: {}}
    out = [
        "",
        "## pgworker (new) against pgworker-base (old), as ratios to each run's floor",
        "",
        "| run | system | processing jobs/s | worker CPU ms/1k | PostgreSQL CPU ms/1k |",
        "|---|---|---:|---:|---:|",
    ]
    for r in runs:
        floor = r["systems"].get("floor", {})
        for name in per:
            m = r["systems"].get(name, {})
            if not all(m.get(k) and floor.get(k) for k, _ in figures):
                continue
            cells = []
            for k, _ in figures:
                ratio = m[k] / floor[k]
                per[name].setdefault(k, []).append(ratio)
                cells.append(f"{fmt(m[k])} ({ratio:.3f}× floor {fmt(floor[k])})")
            out.append(f"| {r['run']} | {name} | " + " | ".join(cells) + " |")
    if not per[BASE] or not per["pgworker"]:
        return []
    for k, label in figures:
        new, old = median(per["pgworker"].get(k, [])), median(per[BASE].get(k, []))
        if new and old:
            out.append(
                f"- {label}, median ratio to the floor: new {new:.3f}×, old {old:.3f}×; "
                f"new / old {new / old:.3f}"
            )
    paired = []
    for k, label in figures:
        pairs = [
            m["pgworker"][k] / m[BASE][k]
            for m in (r["systems"] for r in runs)
            if m.get("pgworker", {}).get(k) and m.get(BASE, {}).get(k)
        ]
        if pairs:
            each = ", ".join(f"{x:.3f}" for x in pairs)
            paired.append(f"{label} {median(pairs):.3f} ({each})")
    out.append("- new / old within each run, median (per run): " + "; ".join(paired))
    return out


async def versions(dsn: str) -> dict[str, str]:
    from importlib import metadata

    conn = await asyncpg.connect(dsn)
    try:
        server = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    out = {}
    for dist in ("pgworker", "procrastinate", "pgqueuer", "chancy", "asyncpg", "psycopg"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    rev = git_rev()
    if rev:
        out["pgworker"] += f" (git {rev})"
    try:
        import psycopg

        out["psycopg"] += f" ({psycopg.pq.__impl__})"
    except ImportError:
        pass
    for name in ("pgworker", BASE):
        src = SYSTEMS[name].src
        if src:
            imported = imported_from(src)  # what its subprocesses import, checked
            if not Path(imported).is_relative_to(src):
                raise BenchError(f"{name}: a subprocess run from {src} imports {imported}")
            out[f"{name} measured"] = f"git {git_rev(src)}, imports {imported}"
    out["PostgreSQL"] = server
    out["Python"] = platform.python_version()
    return out


# --- main ---------------------------------------------------------------------------------------


async def measure(
    res: Resources,
    args: argparse.Namespace,
    name: str,
    db: str,
    tag: str,
    failures: list[str],
    run: int,
) -> dict[str, Any]:
    """One system's figures in a fresh database: W1 then W2 (or W3, or W4)."""
    try:
        dsn = await res.create_db(db)
        try:
            if name == "pgworker@growth":
                return await w4(res, args, dsn, tag)
            system = SYSTEMS[name]
            await system.setup(dsn)
            out: dict[str, Any] = {}
            if "w1" in args.workloads or name == "floor":
                out.update(await w1(res, args, system, dsn, tag))
            if "w2" in args.workloads and system.supports_latency:
                out.update(await w2(res, args, system, dsn, tag))
            return out
        finally:
            await res.drop_db(db)
    except (BenchError, asyncpg.PostgresError, OSError, RuntimeError) as exc:
        what = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"  {name}: FAILED: {what}")
        failures.append(f"run {run} {name}: {what}")
        return {"error": what}


LOCK_KEY = 0x7067_6265_6E63  # one benchmark at a time per server


async def hold_lock(dsn: str) -> asyncpg.Connection:
    """Two benchmarks on one server would drop each other's databases and share its CPU: take
    a session advisory lock for the whole run, waiting for another run to finish."""
    conn = await asyncpg.connect(dsn)
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
        log("another benchmark is running on this server: waiting for it to finish")
        await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    return conn


def git_rev(where: Path = REPO) -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    return ""


async def amain(args: argparse.Namespace, res: Resources) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    args.results.mkdir(parents=True, exist_ok=True)
    lock = await hold_lock(args.dsn)
    try:
        return await run_all(args, res)
    finally:
        await lock.close()


async def run_all(args: argparse.Namespace, res: Resources) -> int:
    rev_at_start = git_rev()
    vers = await versions(args.dsn)
    log("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    runs: list[dict[str, Any]] = []
    explain = None
    failures: list[str] = []
    for run in range(1, args.runs + 1):
        entry: dict[str, Any] = {"run": run, "systems": {}}
        runs.append(entry)
        plan = []
        if "w1" in args.workloads or "w2" in args.workloads:
            plan += [s for s in args.systems]
        if "w3" in args.workloads:
            plan.append("floor")
        if "w4" in args.workloads:
            plan.append("pgworker@growth")
        for name in plan:
            tag = f"run{run}-{name.replace('@', '-')}"
            db = f"bench_{name.replace('@', '_')}_{run}"
            discarded: list[dict[str, Any]] = []
            for attempt in range(args.noisy_retries + 1):
                log(f"run {run}/{args.runs}: {name}" + (f" (again, {attempt})" if attempt else ""))
                out = await measure(res, args, name, db, tag, failures, run)
                if "explain" in out:
                    explain = out.pop("explain")
                noise = out.get("other_cpu_cores", 0.0)
                if noise <= args.noisy_cores or attempt == args.noisy_retries:
                    break
                log(
                    f"  {name}: other programs used {noise:.2f} cores during the drain: "
                    "discarding this measurement and repeating it"
                )
                discarded.append(out)
            if discarded:
                out["discarded_noisy"] = discarded
            entry["systems"][name] = out
    profile_summary = None
    if args.profile:
        log(f"profile: py-spy on a pgworker drain of {args.profile_n:,} jobs")
        try:
            profile_summary = await profile(res, args)
        except BenchError as exc:
            log(f"  profile FAILED: {exc}")
            failures.append(f"profile: {exc}")
    report = {
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "config": {
            "n": args.n,
            "runs": args.runs,
            "chunk": args.chunk,
            "concurrency": 10,
            "rate": args.rate,
            "latency_count": args.latency_count,
            "growth_rows": args.growth_rows,
            "systems": args.systems,
            "workloads": sorted(args.workloads),
            "base_rev": git_rev(args.base_src) if args.base_src else None,
            "pgqueuer_note": (
                "pgqueuer (concurrency 10): `pgqueuer.run(..., batch_size=5, "
                "max_concurrent_tasks=10)`, as in the issue's reference figures (pgqueuer "
                "requires the cap to be at least twice the batch). pgqueuer, own defaults: "
                "`batch_size=10`, no cap on jobs in flight; not a peer in the ratios at the same "
                "concurrency. chancy: asyncio executor, queue concurrency 10, eager_polling=True."
            ),
        },
        "versions": vers,
        "runs": runs,
        "medians": medians(runs),
        "explain": explain,
        "profile": profile_summary,
        "failures": failures,
    }
    text = render(report)
    busy = [
        f"run {r['run']} {name}: {out['other_active_backends_max']}"
        for r in runs
        for name, out in r["systems"].items()
        if out.get("other_active_backends_max")
    ]
    noisy = [
        f"run {r['run']} {name}: {out['other_cpu_cores']:.2f}"
        for r in runs
        for name, out in r["systems"].items()
        if out.get("other_cpu_cores", 0) > 0.1
    ]
    if noisy:
        text += (
            "\nNote: other programs kept the machine busy during some drains (cores used on "
            "average, outside the worker, its PostgreSQL server and the benchmark): "
            + "; ".join(noisy)
            + "\n"
        )
    if busy:
        text += (
            "\nNote: other databases on this server had active queries during some drains "
            "(their PostgreSQL CPU is counted too): " + "; ".join(busy) + "\n"
        )
    rev_at_end = git_rev()
    if rev_at_end != rev_at_start and not SYSTEMS["pgworker"].src:
        text += (
            f"\nNote: the repository moved from {rev_at_start} to {rev_at_end} during the run; "
            "workers started later ran the newer pgworker code.\n"
        )
    if failures:
        text += "\nFailures:\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    print(text)
    (args.results / "latest.md").write_text(text)
    raw = json.dumps(report, indent=2, default=str)
    (args.results / "latest.json").write_text(raw)
    (args.results / f"run-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(raw)
    log(f"wrote {args.results / 'latest.md'} and latest.json")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", default=env.get("BENCH_DSN", DEFAULT_DSN), help="server (URL form)")
    p.add_argument("--n", type=int, default=int(env.get("BENCH_N", 20000)), help="jobs per drain")
    p.add_argument("--runs", type=int, default=int(env.get("BENCH_RUNS", 3)))
    p.add_argument(
        "--systems",
        default=env.get("BENCH_SYSTEMS", ",".join(LIB_SYSTEMS)),
        help="comma-separated, of: " + ",".join(LIB_SYSTEMS),
    )
    p.add_argument(
        "--workloads",
        default=env.get("BENCH_WORKLOADS", ",".join(WORKLOADS)),
        help="comma-separated, of: w1 (throughput), w2 (wake-up latency), w3 (floor), "
        "w4 (pgworker on a grown table)",
    )
    p.add_argument(
        "--base-src",
        type=Path,
        default=env.get("BENCH_BASE_SRC") or None,
        help="a checkout of pgworker (e.g. a git worktree of an older commit) measured as the "
        f"system {BASE}, beside this one (W1 only)",
    )
    p.add_argument(
        "--src",
        type=Path,
        default=env.get("BENCH_SRC") or None,
        help="measure the systems pgworker and pgworker-durable from this checkout instead of "
        "this repository (W1 only)",
    )
    p.add_argument("--chunk", type=int, default=5000, help="jobs per batch-enqueue call")
    p.add_argument("--rate", type=float, default=50.0, help="W2 enqueue rate, jobs/s")
    p.add_argument("--latency-count", type=int, default=500, help="W2 jobs")
    p.add_argument("--growth-rows", type=int, default=1_000_000, help="W4 finished jobs")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=float(env.get("BENCH_QUIET_WAIT", 180)),
        help="before each measurement, wait up to this many seconds for other programs to "
        "leave the cores idle (0: never wait)",
    )
    p.add_argument("--quiet-cores", type=float, default=0.3, help="what counts as idle")
    p.add_argument(
        "--noisy-retries",
        type=int,
        default=2,
        help="repeat a system's measurement (at most this many times) when other programs "
        "used more than --noisy-cores during its drain",
    )
    p.add_argument("--noisy-cores", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one drain may take")
    p.add_argument(
        "--profile",
        action="store_true",
        default=env.get("BENCH_PROFILE") == "1",
        help="also py-spy one pgworker drain",
    )
    p.add_argument("--profile-n", type=int, default=None, help="jobs in the profiled drain (--n)")
    p.add_argument("--profile-seconds", type=int, default=10)
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the databases (debug)")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    for s in args.systems:
        if s not in LIB_SYSTEMS and s != BASE:
            p.error(f"unknown system {s!r}; choose from {', '.join(LIB_SYSTEMS)}, {BASE}")
    if (BASE in args.systems) != bool(args.base_src):
        p.error(f"the system {BASE} and --base-src (BENCH_BASE_SRC) go together")
    for name, src in (
        (BASE, args.base_src),
        ("pgworker", args.src),
        ("pgworker-durable", args.src),
    ):
        if src:
            src = src.resolve()
            if not (src / "pgworker" / "__init__.py").is_file():
                p.error(f"{src} holds no pgworker package")
            SYSTEMS[name].src = src
    args.base_src = SYSTEMS[BASE].src
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.profile_n is None:
        args.profile_n = args.n
    if args.n <= 0 or args.runs <= 0 or args.chunk <= 0:
        p.error("--n, --runs and --chunk must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = Resources(admin_dsn=args.dsn, keep_dbs=args.keep_dbs)
    try:
        return asyncio.run(amain(args, res))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: cleaning up")
        return 130
    finally:
        res.cleanup()


if __name__ == "__main__":
    sys.exit(main())
