"""The pressure run: its database, its processes, its phases and its samples (see
bench/pressure/__init__.py and bench/README.md, "Pressure: a held MVCC horizon").

Everything runs against one database of its own (`bench_pressure_<pid>`, and
`bench_pressure_probe_<pid>` for the search of the sustainable rate), created on the server of
--dsn and dropped at the end; the worker and the producer are processes of their own, killed at
the end whatever happens (an error, Ctrl-C, SIGTERM). The run is bounded: the phases' durations
plus the probe's steps, each wait with its own limit, and an overall deadline."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.measure import (
    BIN,
    REPO,
    BenchError,
    Resources,
    git_rev,
    launch,
    log,
    postmaster_of,
    stop,
    tail,
    wait_quiet,
)
from bench.pressure import report
from bench.procstat import CpuMeter

DEFAULT_DSN = os.environ.get("PGWORKER_DSN") or "postgresql://postgres@127.0.0.1:5432/postgres"
KINDS = ("warmup", "clean", "idle_in_tx", "active_readers", "overload", "recovery")
HELD = ("idle_in_tx", "active_readers")
"""The phases that hold the MVCC horizon."""
FULL = (
    "warmup:10,clean:60,idle_in_tx:900,recovery:120,active_readers:900,recovery:120,"
    "overload:120,recovery:120"
)
SHORT = "warmup:5,clean:30,idle_in_tx:30,active_readers:30,overload:15,recovery:15"
TYPE = "pressure"
SCHEMA = "pgworker"

# One sample's window ($1, $2]: the pickup of the attempts started in it (wait_ms: the claim's
# time minus the job's run_at), read along job_attempts_type_started_idx; and the jobs whose
# completion was written in it (their finished_at), along jobs_finished_idx, whose entries are
# final (a finished job's row changes no more), so that it reads no dead entry however long the
# horizon is held.
WINDOW_SQL = f"""
SELECT (SELECT count(*) FROM {SCHEMA}.job_attempts
        WHERE type = '{TYPE}' AND started_at > $1 AND started_at <= $2) AS started,
       (SELECT count(*) FROM {SCHEMA}.jobs
        WHERE finished_at > $1 AND finished_at <= $2 AND status = 'completed'
          AND type = '{TYPE}') AS completed,
       (SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY wait_ms)
        FROM {SCHEMA}.job_attempts
        WHERE type = '{TYPE}' AND started_at > $1 AND started_at <= $2) AS pickup,
       (SELECT max(wait_ms) FROM {SCHEMA}.job_attempts
        WHERE type = '{TYPE}' AND started_at > $1 AND started_at <= $2) AS pickup_max
"""
PENDING_SQL = f"""
SELECT count(*) FROM {SCHEMA}.jobs
WHERE status = 'pending' AND queue = 'default' AND type = '{TYPE}' AND version = 1
"""
# Claimed and not yet ended (in the worker's hands), along jobs_lease_idx.
RUNNING_SQL = f"""
SELECT count(*) FROM {SCHEMA}.jobs
WHERE lease_expires_at IS NOT NULL AND status = 'running' AND type = '{TYPE}'
"""
# The statements running in this database but the harness's, by their first line.
ACTIVITY_SQL = """
SELECT split_part(ltrim(query), E'\\n', 1) AS first, wait_event_type,
       extract(epoch FROM clock_timestamp() - query_start)::float8 AS seconds
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'
  AND backend_type = 'client backend'
"""
TABLES_SQL = """
SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.n_tup_upd, s.n_tup_hot_upd,
       pg_table_size(s.relid) AS heap_bytes, pg_indexes_size(s.relid) AS index_bytes
FROM pg_stat_user_tables AS s WHERE s.schemaname = $1 ORDER BY s.relname
"""
INDEXES_SQL = """
SELECT s.relname, s.indexrelname, s.idx_scan, s.idx_tup_read, s.idx_tup_fetch,
       io.idx_blks_hit, io.idx_blks_read, pg_relation_size(s.indexrelid) AS bytes
FROM pg_stat_user_indexes AS s
JOIN pg_statio_user_indexes AS io USING (indexrelid)
WHERE s.schemaname = $1 ORDER BY s.relname, s.indexrelname
"""
# How long the horizon has been held, and by how many transactions: the oldest transaction that
# holds it, that is one of this database's that holds a snapshot, or one of ANY database's that
# holds an xid (every snapshot taken while it runs, the worker's too, keeps its xmin below it);
# and how far behind the newest xid this database's oldest snapshot is.
HORIZON_SQL = """
SELECT extract(epoch FROM now() - min(xact_start) FILTER (
           WHERE backend_xid IS NOT NULL
              OR datname = current_database() AND backend_xmin IS NOT NULL))::float8,
       max(age(backend_xmin)) FILTER (WHERE datname = current_database())
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
"""
SPAN_SQL = WINDOW_SQL
# What a direct worker's connections run its statements with (pgworker/_db/connection.py).
WORKER_SETTINGS = {
    "plan_cache_mode": "force_generic_plan",
    "enable_bitmapscan": "off",
    "enable_seqscan": "off",
    "jit": "off",
}
LAG = datetime.timedelta(seconds=1)
"""A sample's window ends this long before the sample: claims still running at the sample
commit within it, and are counted in their own window."""


# --- options -----------------------------------------------------------------------------------


@dataclass
class Phase:
    kind: str
    seconds: float
    label: str = ""


def parse_phases(text: str) -> list[Phase]:
    phases: list[Phase] = []
    seen: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, seconds = part.partition(":")
        if kind not in KINDS:
            raise ValueError(f"--phases: unknown phase {kind!r}; choose from {', '.join(KINDS)}")
        try:
            duration = float(seconds)
        except ValueError:
            raise ValueError(f"--phases: {part!r} needs seconds, e.g. {kind}:60") from None
        if duration <= 0:
            raise ValueError(f"--phases: {part!r}: seconds must be > 0")
        seen[kind] = seen.get(kind, 0) + 1
        label = kind if seen[kind] == 1 else f"{kind}_{seen[kind]}"
        phases.append(Phase(kind, duration, label))
    if not any(p.kind == "clean" for p in phases):
        raise ValueError("--phases: a `clean` phase is needed (the others are compared with it)")
    return phases


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.pressure",
        description="Pickup latency, throughput and table bloat of one pgworker worker at a "
        "fixed offered rate while the MVCC horizon is held.",
    )
    p.add_argument("--dsn", default=DEFAULT_DSN, help="server to create the run's database on")
    p.add_argument(
        "--rate",
        default="800",
        help="offered jobs per second, or `max`: first find the highest rate one worker "
        "sustains here, and run at it (default 800)",
    )
    p.add_argument("--short", action="store_true", help=f"the reduced form: --phases {SHORT}")
    p.add_argument("--phases", help=f"kind:seconds,... in order (default {FULL})")
    p.add_argument(
        "--overload-rate",
        type=float,
        help="the `overload` phase's rate (default 1.5 x the sustainable rate: found by the "
        "probe, which runs when the phases hold an overload and not --short; else 1.5 x --rate)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="the worker's slots (default 32)")
    p.add_argument("--handler-ms", type=float, default=1.0, help="handler time (default 1)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds (default 5)")
    p.add_argument(
        "--tail", type=float, default=60.0, help="a phase's last seconds compared (default 60)"
    )
    p.add_argument("--readers", type=int, default=4, help="active_readers' readers (default 4)")
    p.add_argument(
        "--reader-pause",
        type=float,
        default=1.0,
        help="seconds a reader waits between two scans (default 1)",
    )
    p.add_argument("--tick-ms", type=float, default=10.0, help="the producer's tick (default 10)")
    p.add_argument("--no-probe", action="store_true", help="never search the sustainable rate")
    p.add_argument("--probe-step", type=float, default=12.0, help="seconds per probe step")
    p.add_argument(
        "--min-kept-up",
        type=float,
        default=0.95,
        help="the clean phase must complete this share of the offered rate, else exit 1",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=REPO / "bench" / "results" / "pressure.json",
        help="the samples' JSON (default bench/results/pressure.json)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="first wait (at most this many seconds) for the machine's cores to be idle",
    )
    p.add_argument("--keep-db", action="store_true", help="leave the database for inspection")
    a = p.parse_args(argv)
    try:
        a.phases = parse_phases(a.phases or (SHORT if a.short else FULL))
    except ValueError as exc:
        p.error(str(exc))
    if a.rate != "max":
        try:
            a.rate = float(a.rate)
        except ValueError:
            p.error(f"--rate: a number of jobs per second or `max`, not {a.rate!r}")
        if a.rate <= 0:
            p.error("--rate must be > 0")
    if a.concurrency < 1 or a.sample_every <= 0 or a.tail <= 0 or a.readers < 1:
        p.error("--concurrency, --sample-every, --tail and --readers must be > 0")
    has_overload = any(ph.kind == "overload" for ph in a.phases)
    a.probe = not a.no_probe and (
        a.rate == "max" or (has_overload and a.overload_rate is None and not a.short)
    )
    if a.rate == "max" and a.no_probe:
        p.error("--rate max needs the probe: drop --no-probe")
    return a


# --- the processes ------------------------------------------------------------------------------


class Producer:
    """bench/pressure/enqueuer.py in a session of its own: told its rate on stdin, its counts
    read from its stdout."""

    def __init__(self, res: Resources, dsn: str, rate: float, tick_ms: float) -> None:
        self.res, self.dsn, self.rate, self.tick_ms = res, dsn, rate, tick_ms
        self.proc: asyncio.subprocess.Process | None = None
        self.last: dict[str, Any] = {"sent": 0, "behind": 0.0}
        self.behind = 0.0
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.pressure.enqueuer",
            "--dsn",
            self.dsn,
            "--rate",
            str(self.rate),
            "--tick-ms",
            str(self.tick_ms),
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self.res.procs[self.proc.pid] = "bench.pressure.enqueuer"
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.last = json.loads(line)
                self.behind = max(self.behind, float(self.last.get("behind", 0)))

    def take_behind(self) -> float:
        """The most jobs the producer was behind its schedule since the last call."""
        out, self.behind = self.behind, 0.0
        return out

    async def set_rate(self, rate: float) -> None:
        self.rate = rate
        await self._say(f"rate {rate}")

    async def _say(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        if self.proc.returncode is not None:
            raise BenchError(f"the producer exited with {self.proc.returncode}")
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def close(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(Exception):
            await self._say("stop")
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)
        self.res.procs.pop(self.proc.pid, None)


async def migrate(dsn: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "pgworker"),
        "migrate",
        "--dsn",
        dsn,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        raise BenchError(f"pgworker migrate failed: {out.decode()}")


def start_worker(
    res: Resources, args: argparse.Namespace, dsn: str, log_path: Path
) -> subprocess.Popen[bytes]:
    argv = [
        str(BIN / "pgworker"),
        "run",
        "bench.apps.pressure_app",
        "--concurrency",
        str(args.concurrency),
        "--log-level",
        "warning",
        "--dsn",
        dsn,
    ]
    return launch(res, argv, dsn, log_path, {"BENCH_PRESSURE_HANDLER_MS": str(args.handler_ms)})


async def wait_served(conn: asyncpg.Connection, worker: subprocess.Popen[bytes], log_path: Path):
    """Until the worker has completed a job (60 s at most)."""
    deadline = time.monotonic() + 60
    while not await conn.fetchval(
        f"SELECT EXISTS (SELECT FROM {SCHEMA}.job_attempts WHERE outcome = 'completed')"
    ):
        if worker.poll() is not None:
            raise BenchError(f"the worker exited with {worker.returncode}:\n{tail(log_path)}")
        if time.monotonic() > deadline:
            raise BenchError(f"the worker completed no job in 60 s:\n{tail(log_path)}")
        await asyncio.sleep(0.1)


# --- what holds the horizon ---------------------------------------------------------------------


class Holder:
    """`idle_in_tx`: one session that began a transaction, took an xid and went idle."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None
        self.xid: int | None = None

    async def enter(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        await self.conn.execute("BEGIN")
        self.xid = await self.conn.fetchval("SELECT txid_current()")
        log(f"  idle_in_tx: holding xid {self.xid}")

    async def exit(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.execute("ROLLBACK"), 10)
            await close(self.conn)
            self.conn = None


class Readers:
    """`active_readers`: n sessions, each in one REPEATABLE READ transaction for the whole
    phase, scanning pgworker's hot tables in turn (count(*), no parallel workers: the machine
    is small) with `pause` seconds between scans."""

    TABLES = ("jobs", "job_attempts")

    def __init__(self, dsn: str, n: int, pause: float) -> None:
        self.dsn, self.n, self.pause = dsn, n, pause
        self.conns: list[asyncpg.Connection] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.scans = 0

    async def enter(self) -> None:
        for i in range(self.n):
            conn = await asyncpg.connect(self.dsn)
            self.conns.append(conn)
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            # The snapshot is taken by the first query: take it now, all readers together.
            await conn.fetchval("SELECT 1")
            self.tasks.append(asyncio.create_task(self._scan(conn, i)))
        log(f"  active_readers: {self.n} REPEATABLE READ transactions open")

    async def _scan(self, conn: asyncpg.Connection, i: int) -> None:
        k = i
        while True:
            table = self.TABLES[k % len(self.TABLES)]
            await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.{table}")
            self.scans += 1
            k += 1
            await asyncio.sleep(self.pause)

    async def exit(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(BaseException):
                await task
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.execute("ROLLBACK"), 10)
            await close(conn)
        log(f"  active_readers: {self.scans} scans")
        self.conns, self.tasks = [], []


async def close(conn: asyncpg.Connection) -> None:
    try:
        await asyncio.wait_for(conn.close(), 5)
    except Exception:
        conn.terminate()


# --- the samples ----------------------------------------------------------------------------------


@dataclass
class Sampler:
    """One connection that samples the run's database every few seconds."""

    conn: asyncpg.Connection
    meter: CpuMeter
    producer: Producer
    t0: float
    since: Any = None  # the database time the last window ended
    cpu: tuple[float, ...] = ()
    cpu_at: float = 0.0
    sent: int = 0
    sent_at: float = 0.0
    indexes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    log_path: Path | None = None
    log_at: int = 0
    statements: dict[str, str] = field(default_factory=dict)

    async def begin(self) -> None:
        # pgworker's statements by their first line (each file's opening comment).
        self.statements = {
            text.lstrip().split("\n", 1)[0].strip(): name
            for name, text in claim_statements().items()
        }
        self.since = await self.conn.fetchval("SELECT clock_timestamp() - $1::interval", LAG)
        self.cpu, self.cpu_at = self.meter.sample(), time.monotonic()
        self.sent, self.sent_at = int(self.producer.last["sent"]), time.monotonic()
        self.indexes = {r["indexrelname"]: _index_counts(r) for r in await self._indexes()}

    async def _indexes(self) -> list[asyncpg.Record]:
        return await self.conn.fetch(INDEXES_SQL, SCHEMA)

    async def sample(self, phase: Phase, rate: float) -> dict[str, Any]:
        until = await self.conn.fetchval("SELECT clock_timestamp() - $1::interval", LAG)
        seconds = (until - self.since).total_seconds()
        w = await self.conn.fetchrow(WINDOW_SQL, self.since, until)
        pending = await self.conn.fetchval(PENDING_SQL)
        running = await self.conn.fetchval(RUNNING_SQL)
        horizon_s, horizon_xids = await self.conn.fetchrow(HORIZON_SQL)
        activity: dict[str, dict[str, Any]] = {}
        for r in await self.conn.fetch(ACTIVITY_SQL):
            first = r["first"].strip()
            a = activity.setdefault(
                self.statements.get(first, first[:60]), {"active": 0, "on_locks": 0, "longest_s": 0}
            )
            a["active"] += 1
            a["on_locks"] += r["wait_event_type"] == "Lock"
            a["longest_s"] = max(a["longest_s"], r["seconds"] or 0)
        tables = {
            r["relname"]: {
                "live": r["n_live_tup"],
                "dead": r["n_dead_tup"],
                "heap_bytes": r["heap_bytes"],
                "index_bytes": r["index_bytes"],
                "autovacuums": r["autovacuum_count"],
                "updates": r["n_tup_upd"],
                "hot_updates": r["n_tup_hot_upd"],
            }
            for r in await self.conn.fetch(TABLES_SQL, SCHEMA)
        }
        indexes: dict[str, dict[str, Any]] = {}
        for r in await self._indexes():
            now = _index_counts(r)
            before = self.indexes.get(r["indexrelname"], (0, 0, 0, 0, 0))
            d = [a - b for a, b in zip(now, before, strict=True)]
            indexes[r["indexrelname"]] = {
                "table": r["relname"],
                "bytes": r["bytes"],
                "scans": d[0],
                "entries_read": d[1],
                "rows_fetched": d[2],
                "blocks": d[3] + d[4],
                "entries_per_scan": d[1] / d[0] if d[0] else None,
                "blocks_per_scan": (d[3] + d[4]) / d[0] if d[0] else None,
            }
            self.indexes[r["indexrelname"]] = now
        cpu, at = self.meter.sample(), time.monotonic()
        wall = at - self.cpu_at
        worker, pg, own, busy = (cpu[i] - self.cpu[i] for i in range(4))
        self.cpu, self.cpu_at = cpu, at
        sent = int(self.producer.last["sent"])
        sent_rate = (sent - self.sent) / max(at - self.sent_at, 1e-9)
        self.sent, self.sent_at = sent, at
        pickup = w["pickup"] or [None, None, None]
        self.since = until
        return {
            "t": round(time.monotonic() - self.t0, 1),
            "phase": phase.label,
            "at": until.isoformat(),
            "window_s": round(seconds, 3),
            "offered_rate": rate,
            "sent_rate": sent_rate,
            "producer_behind_jobs": self.producer.take_behind(),
            "started_rate": w["started"] / seconds,
            "completed_rate": w["completed"] / seconds,
            "pickup_p50_ms": pickup[0],
            "pickup_p95_ms": pickup[1],
            "pickup_p99_ms": pickup[2],
            "pickup_max_ms": w["pickup_max"],
            "pending": pending,
            "running": running,
            "horizon_age_s": horizon_s,
            "horizon_xids": horizon_xids,
            "statements": activity,
            "worker_log": self._worker_log(),
            "cpu_cores": {
                "worker": worker / wall,
                "postgres": pg / wall,
                "harness_and_producer": own / wall,
                "others": max(busy - worker - pg - own, 0.0) / wall,
            },
            "tables": tables,
            "indexes": indexes,
        }

    def _worker_log(self) -> dict[str, int]:
        """The worker's log lines since the last sample, counted by message."""
        if self.log_path is None:
            return {}
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_at)
                data = f.read()
        except OSError:
            return {}
        self.log_at += len(data)
        out: dict[str, int] = {}
        for line in data.decode(errors="replace").splitlines():
            m = re.search(r"\]\s+(.*?)(?=\s+\w+=|$)", line)
            text = (m.group(1) if m else line).strip()[:100]
            out[text] = out.get(text, 0) + 1
        return out


def _index_counts(r: asyncpg.Record) -> tuple[int, ...]:
    return tuple(
        int(r[k] or 0)
        for k in ("idx_scan", "idx_tup_read", "idx_tup_fetch", "idx_blks_hit", "idx_blks_read")
    )


async def span(conn: asyncpg.Connection, start: Any, end: Any) -> dict[str, Any]:
    """Pickup percentiles and rates over attempts started (completed) in (start, end]."""
    r = await conn.fetchrow(SPAN_SQL, start, end)
    seconds = (end - start).total_seconds()
    pickup = r["pickup"] or [None, None, None]
    return {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "seconds": seconds,
        "started_rate": r["started"] / seconds,
        "completed_rate": r["completed"] / seconds,
        "pickup_p50_ms": pickup[0],
        "pickup_p95_ms": pickup[1],
        "pickup_p99_ms": pickup[2],
    }


# --- the claim under EXPLAIN --------------------------------------------------------------------


def claim_statements() -> dict[str, str]:
    """pgworker's statements by name, exactly as the worker prepares them (sql/queries/ with
    their fragments, schema and columns filled in)."""
    from pgworker._db import files

    return dict(files.queries(SCHEMA))


async def explain_claim(dsn: str, limit: int, repeat: int = 3) -> dict[str, Any]:
    """The worker's plain claim of up to `limit` jobs under EXPLAIN (ANALYZE, BUFFERS), in a
    session with the worker's settings (generic plan, no bitmap or sequential scans, no JIT),
    as a prepared statement; each run rolled back. Its figures are the medians of `repeat` runs;
    the plan's text is the last run's."""
    sql = claim_statements()["job_claim"]
    count = max(int(m) for m in re.findall(r"\$(\d+)", sql))
    types = ["text[]", "text[]", "int", "text", "float8", "int[]", "text", "text", "text[]"]
    types += ["integer[]", "boolean", "integer[]"]
    if count != len(types):
        raise BenchError(f"the claim takes {count} parameters; the harness knows {len(types)}")
    params = (
        f"'{{default}}', '{{{TYPE}}}', {limit}, 'pressure-explain', 30, '{{3}}', NULL, 'off', "
        f"'{{{TYPE}}}', '{{1}}', false, NULL"
    )
    conn = await asyncpg.connect(dsn, server_settings=WORKER_SETTINGS)
    runs: list[dict[str, Any]] = []
    text: list[str] = []
    try:
        await conn.execute(f"PREPARE pressure_claim({', '.join(types)}) AS {sql}")
        for i in range(repeat + 1):
            fmt = "TEXT" if i == repeat else "JSON"
            tr = conn.transaction()
            await tr.start()
            try:
                rows = await conn.fetch(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT {fmt}) EXECUTE pressure_claim({params})"
                )
            finally:
                await tr.rollback()  # the claim really ran: undo it
            if fmt == "TEXT":
                text = [r[0] for r in rows]
            else:
                runs.append(plan_figures(json.loads(rows[0][0])[0]))
    finally:
        await close(conn)
    return {"runs": runs, "median": median_figures(runs), "plan": text}


def plan_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """From one EXPLAIN (FORMAT JSON): the execution time, the shared buffers of the whole
    statement (the top node's, which count the CTEs it reads, plus those of each CTE nothing
    reads: a data-modifying CTE runs to its end apart), and those of each scan (by index, or
    table; a node's buffers include those of the subplans it runs)."""
    scans: dict[str, dict[str, float]] = {}
    ctes: dict[str, int] = {}
    read: set[str] = set()

    def buffers(node: dict[str, Any]) -> int:
        return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))

    def walk(node: dict[str, Any], where: str) -> None:
        name = node.get("Subplan Name", "")
        if name.startswith("CTE "):
            ctes[name[4:]] = buffers(node)
        if node["Node Type"] == "CTE Scan":
            read.add(node["CTE Name"])
        where = name or where
        if "Scan" in node["Node Type"] and ("Index Name" in node or "Relation Name" in node):
            what = node.get("Index Name") or node["Relation Name"]
            key = f"{node['Node Type']} {'using' if 'Index Name' in node else 'on'} {what}"
            key = f"{key} ({where})" if where else key
            s = scans.setdefault(key, {"buffers": 0, "rows": 0, "loops": 0})
            s["buffers"] += buffers(node)
            s["rows"] += node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
            s["loops"] += node.get("Actual Loops", 1)
        for child in node.get("Plans", ()):
            walk(child, where)

    plan = doc["Plan"]
    walk(plan, "")
    total = buffers(plan) + sum(b for name, b in ctes.items() if name not in read)
    return {
        "execution_ms": doc.get("Execution Time"),
        "planning_ms": doc.get("Planning Time"),
        "buffers": total,
        "scans": scans,
    }


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if not runs:
        return {}
    keys = sorted({k for r in runs for k in r["scans"]})
    return {
        "execution_ms": statistics.median(r["execution_ms"] for r in runs),
        "buffers": statistics.median(r["buffers"] for r in runs),
        "scans": {
            k: {
                f: statistics.median(r["scans"].get(k, {}).get(f, 0) for r in runs)
                for f in ("buffers", "rows", "loops")
            }
            for k in keys
        },
    }


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Run:
    args: argparse.Namespace
    res: Resources
    deadline: float
    logs: Path = REPO / "bench" / "results" / "logs"

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise BenchError("the run took longer than its deadline: stopped")


async def probe(run: Run) -> dict[str, Any]:
    """The highest offered rate one worker keeps up with here, in a database of its own: steps
    of `--probe-step` seconds from 800/s (x1.25 up while it keeps up, x0.8 down while it does
    not), at most 10; a step keeps up when the completions of its last two thirds reach 97% of
    the rate and the backlog at its end is under a quarter of a second's jobs."""
    args, res = run.args, run.res
    name = f"bench_pressure_probe_{os.getpid()}"
    dsn = await res.create_db(name)
    steps: list[dict[str, Any]] = []
    try:
        await migrate(dsn)
        log_path = run.logs / "pressure-probe-worker.log"
        worker = start_worker(res, args, dsn, log_path)
        producer = Producer(res, dsn, 800.0, args.tick_ms)
        conn = await asyncpg.connect(dsn)
        try:
            await producer.start()
            await wait_served(conn, worker, log_path)
            rate, best, worst = 800.0, None, None
            for _ in range(10):
                run.check_time()
                await producer.set_rate(rate)
                await asyncio.sleep(args.probe_step / 3)
                start = await conn.fetchval("SELECT clock_timestamp()")
                await asyncio.sleep(args.probe_step * 2 / 3)
                end = await conn.fetchval("SELECT clock_timestamp() - $1::interval", LAG)
                s = await span(conn, start, end)
                pending = await conn.fetchval(PENDING_SQL)
                kept = s["completed_rate"] >= 0.97 * rate and pending < rate / 4
                if worker.poll() is not None:
                    raise BenchError(f"the worker exited:\n{tail(log_path)}")
                steps.append({"rate": rate, "kept_up": kept, "pending": pending, **s})
                log(
                    f"  probe {rate:,.0f}/s: completed {s['completed_rate']:,.0f}/s, "
                    f"{pending:,} pending, pickup p50 {_ms(s['pickup_p50_ms'])}: "
                    + ("kept up" if kept else "fell behind")
                )
                if kept:
                    best = rate if best is None else max(best, rate)
                else:
                    worst = rate if worst is None else min(worst, rate)
                if best is not None and worst is not None:
                    break
                rate = rate * 1.25 if kept else rate * 0.8
                # Let a backlog drain before the next step (30 s at most).
                await producer.set_rate(0)
                for _ in range(300):
                    if not await conn.fetchval(PENDING_SQL):
                        break
                    await asyncio.sleep(0.1)
            if best is None:
                raise BenchError("the probe found no rate this worker keeps up with")
        finally:
            await producer.close()
            await stop(res, worker)
            await close(conn)
    finally:
        await res.drop_db(name)
    log(f"probe: one worker sustains {best:,.0f} jobs/s here")
    return {"sustainable_rate": best, "steps": steps}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


async def run_phases(run: Run, rate: float, overload_rate: float) -> list[dict[str, Any]]:
    args, res = run.args, run.res
    name = f"bench_pressure_{os.getpid()}"
    dsn = await res.create_db(name)
    out: list[dict[str, Any]] = []
    try:
        await migrate(dsn)
        log_path = run.logs / "pressure-worker.log"
        worker = start_worker(res, args, dsn, log_path)
        producer = Producer(res, dsn, rate, args.tick_ms)
        conn = await asyncpg.connect(dsn)
        try:
            meter = CpuMeter(root=worker.pid, postmaster=postmaster_of(conn))
            meter.exclude.add(conn.get_server_pid())
            await producer.start()
            await wait_served(conn, worker, log_path)
            log(f"worker up (pid {worker.pid}); offering {rate:,.0f} jobs/s")
            sampler = Sampler(conn, meter, producer, time.monotonic(), log_path=log_path)
            await sampler.begin()
            for phase in args.phases:
                out.append(
                    await one_phase(
                        run,
                        phase,
                        dsn,
                        conn,
                        sampler,
                        worker,
                        producer,
                        log_path,
                        rate,
                        overload_rate,
                    )
                )
        finally:
            await producer.close()
            await stop(res, worker)
            await close(conn)
    finally:
        await res.drop_db(name)
    return out


async def one_phase(
    run: Run,
    phase: Phase,
    dsn: str,
    conn: asyncpg.Connection,
    sampler: Sampler,
    worker: subprocess.Popen[bytes],
    producer: Producer,
    log_path: Path,
    rate: float,
    overload_rate: float,
) -> dict[str, Any]:
    args = run.args
    phase_rate = overload_rate if phase.kind == "overload" else rate
    hold: Holder | Readers | None = None
    if phase.kind == "idle_in_tx":
        hold = Holder(dsn)
    elif phase.kind == "active_readers":
        hold = Readers(dsn, args.readers, args.reader_pause)
    log(f"phase {phase.label}: {phase.seconds:g} s at {phase_rate:,.0f} jobs/s")
    start = await conn.fetchval("SELECT clock_timestamp()")
    t_start = time.monotonic()
    samples: list[dict[str, Any]] = []
    explain: dict[str, Any] | None = None
    try:
        if producer.rate != phase_rate:
            await producer.set_rate(phase_rate)
        if hold is not None:
            await hold.enter()
        end_at = t_start + phase.seconds
        while True:
            run.check_time()
            left = end_at - time.monotonic()
            await asyncio.sleep(max(min(args.sample_every, left), 0))
            if worker.poll() is not None:
                raise BenchError(f"the worker exited with {worker.returncode}:\n{tail(log_path)}")
            if not producer.alive():
                raise BenchError("the producer exited")
            s = await sampler.sample(phase, phase_rate)
            s["phase_t"] = round(time.monotonic() - t_start, 1)
            samples.append(s)
            report.sample_line(s, first=len(samples) == 1)
            if time.monotonic() >= end_at - 0.05:
                break
        if phase.kind != "warmup":
            # While the horizon is still held: the claim as the phase leaves it.
            explain = await explain_claim(dsn, args.concurrency)
    finally:
        if hold is not None:
            await hold.exit()
    end = await conn.fetchval("SELECT clock_timestamp() - $1::interval", LAG)
    tail_from = max(start, end - datetime.timedelta(seconds=args.tail))
    result = {
        "label": phase.label,
        "kind": phase.kind,
        "seconds": phase.seconds,
        "rate": phase_rate,
        "held": phase.kind in HELD,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "whole": await span(conn, start, end),
        "tail": await span(conn, tail_from, end),
        "end": samples[-1] if samples else None,
        "explain": explain,
        "samples": samples,
    }
    report.phase_end(result)
    return result


async def amain(args: argparse.Namespace, res: Resources) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    phases_s = sum(p.seconds for p in args.phases)
    budget = phases_s + args.quiet_wait + 120 + (10 * (args.probe_step + 35) if args.probe else 0)
    run = Run(args, res, time.monotonic() + budget)
    admin = await asyncpg.connect(args.dsn)
    try:
        server = await admin.fetchval("SHOW server_version")
    finally:
        await close(admin)
    config = {
        "rate": args.rate,
        "phases": [[p.label, p.kind, p.seconds] for p in args.phases],
        "concurrency": args.concurrency,
        "handler_ms": args.handler_ms,
        "sample_every_s": args.sample_every,
        "tail_s": args.tail,
        "readers": args.readers,
        "reader_pause_s": args.reader_pause,
        "tick_ms": args.tick_ms,
        "short": args.short,
        "pgworker": f"git {git_rev()}",
        "postgresql": server,
        "cores": os.cpu_count(),
    }
    log(
        f"pressure: pgworker git {git_rev()}, PostgreSQL {server}, {os.cpu_count()} cores; "
        f"phases {', '.join(f'{p.label} {p.seconds:g}s' for p in args.phases)}"
    )
    if args.quiet_wait > 0:
        await wait_quiet(args.quiet_wait, 0.3)
    probed = await probe(run) if args.probe else None
    sustainable = probed["sustainable_rate"] if probed else None
    rate = sustainable if args.rate == "max" else args.rate
    assert isinstance(rate, float)
    overload = args.overload_rate or 1.5 * (sustainable or rate)
    config["offered_rate"] = rate
    config["overload_rate"] = overload
    config["overload_basis"] = (
        "--overload-rate"
        if args.overload_rate
        else "1.5 x the probe's sustainable rate"
        if sustainable
        else "1.5 x --rate (no probe)"
    )
    phases = await run_phases(run, rate, overload)
    checks = report.checks(phases, args.min_kept_up)
    doc = {"config": config, "probe": probed, "phases": phases, "checks": checks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    report.summary(doc)
    log(f"samples written to {args.out}")
    return 0 if checks["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = Resources(admin_dsn=args.dsn, keep_dbs=args.keep_db)
    try:
        return asyncio.run(amain(args, res))
    except BenchError as exc:
        log(f"FAILED: {exc}")
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: cleaning up")
        return 130
    finally:
        res.cleanup()
