"""`make failover`: a primary and its synchronous standby, managed by pg_auto_failover (Debian's
postgresql-NN-auto-failover: a monitor and two data nodes, all on 127.0.0.1, in a temporary
directory), serve two real `pgworker run tests.apps.failover` workers and an enqueuer process,
all three on the multi-host DSN `postgresql://…@127.0.0.1:P1,127.0.0.1:P2/pgworker?
target_session_attrs=read-write`. The enqueuer records every acknowledged enqueue (its job id
and idempotency key); the handlers record every run of theirs (tests/apps/failover.py).

Mid-run the primary's node is killed as its machine would die: SIGKILL to its pg_autoctl, its
postmaster and every backend at once (its keeper's process group, and every process working in
its data directory: each child of a postmaster leads a process group of its own).
pg_auto_failover promotes the standby. Then the run checks that:

- every acknowledged enqueue exists on the new primary, under its id, and completed there;
- every job completed exactly once, and every other run of its handler is explained: by an
  attempt row closed as `lost` (the rescue of a lease that ran out), or, for a worker with fast
  claims only, by a claim the failover undid (no attempt row, since that claim never reached
  the standby) that the worker's log names (`lease lost`, `outcome dropped`);
- both workers served on without a restart (the same PIDs, each completing jobs on the new
  primary);

and prints the times from the kill to the promotion, to the first acknowledged enqueue, to the
first job completed on the new primary, and the counts (acknowledged, completed, reruns).

The two workers differ on purpose: `w1` runs with the defaults (lease 30 s, fast claims), `w2`
with `--durable-claims` and a lease of LEASE_W2 seconds, shorter than the failover, so that it
fences itself and its jobs are rescued on the new primary. pg_auto_failover's timeouts are
shortened (TIMEOUTS, KEEPER_TIMEOUTS) to keep the run short; the keepers' network partition
timeout stays below the monitor's demote timeout, as with its defaults. FAILOVER_TIMEOUTS=default
keeps pg_auto_failover's own (the standby then takes writes about 50 s after the kill).

Skips (exit 0, saying why) without pg_autoctl or the pgautofailover extension; as root, the
PostgreSQL side runs as the `postgres` user. Bounded: every wait has a limit and the whole run
BUDGET seconds. Kills its process groups and removes its directory whatever happens (SIGTERM and
SIGINT included), and at start what a crashed earlier run left (directories named PREFIX-*); a
failed run keeps only its logs (the workers', the enqueuer's, pg_autoctl's), until the next run.
FAILOVER_BREAK=rescue breaks the rescue on purpose: the run must then fail, saying why.

`python -m tests.failover enqueue --dsn DSN --out FILE` is the enqueuer alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

import pgworker

from .harness import Broken, Skip, arm, disarm, ended, wait_until

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "pgwfo"
BUDGET = 200
RATE = 40.0
"""Enqueues per second."""
SHORT_MS, LONG_MS, HOLD_MS = 100, 1500, 10000
"""The handlers' run times: every tenth job is long, so that jobs are running at the kill, and
the harness gives each worker one job longer than the failover, in a queue only that worker
serves, just before the kill: w2's still runs when w2 fences itself."""
LEASE_W2 = 8.0
AFTER_KILL = 60
"""Enqueues node2 must acknowledge before the enqueuer is stopped."""
TIMEOUTS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_max_retries": 1,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 4000,
    "pgautofailover.primary_demote_timeout": 8000,
}
"""The monitor's settings (ms; defaults 5000, 5000, 2, 2000, 20000, 30000): how soon it finds the
primary unhealthy, and how long the promoted standby waits for the old primary to demote
itself before it takes writes."""
KEEPER_TIMEOUTS = {"timeout.network_partition_timeout": "4"}
"""The nodes' keepers (seconds; default 20): a primary that reaches neither the monitor nor its
standby for this long demotes itself; it must stay below primary_demote_timeout."""
if os.environ.get("FAILOVER_TIMEOUTS") == "default":  # pg_auto_failover's own: a longer run
    TIMEOUTS, KEEPER_TIMEOUTS = {}, {}
LOG_EVENTS = {
    "fence": "lost contact with the database",
    "resume": "the database answers again",
    "lease_lost": "lease lost: stopping the attempt",
    "dropped": "outcome dropped: this attempt no longer holds the job",
}


# The cluster ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pg_bindir() -> Path:
    """The binaries of the PostgreSQL major that has the pgautofailover extension."""
    for control in sorted(Path("/usr/share/postgresql").glob("*/extension/pgautofailover.control")):
        bindir = Path("/usr/lib/postgresql") / control.parts[-3] / "bin"
        if (bindir / "pg_ctl").exists():
            return bindir
    raise Skip(
        "no pgautofailover extension (apt-get install postgresql-NN-auto-failover; .ci/run does)"
    )


def postgres_user() -> pwd.struct_passwd:
    """Who runs pg_autoctl and PostgreSQL: `postgres` when we are root (PostgreSQL refuses
    root), else ourselves."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise Skip("running as root, and there is no `postgres` user to run PostgreSQL") from None


def processes_in(path: str) -> list[int]:
    """The processes working in a directory whose path starts with `path` (PostgreSQL's work in
    their data directory, even once it is deleted), or whose command line names it. Each child
    of a postmaster leads a process group of its own: a group's kill misses them, and some (the
    logger, the monitor's health check worker) outlive their postmaster."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(proc / "cwd").startswith(path) or (
                path.encode() in (proc / "cmdline").read_bytes()
            ):
                found.append(int(proc.name))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def clean_earlier() -> list[str]:
    """Kill what crashed earlier runs left running, and remove their directories."""
    prefix = str(Path(tempfile.gettempdir()) / f"{PREFIX}-")
    left = processes_in(prefix)
    kill_all(left)
    removed = [f"{len(left)} processes"] if left else []
    for old in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*"):
        shutil.rmtree(old, ignore_errors=True)
        removed.append(str(old))
    return removed


class Autoctl:
    """pg_autoctl, run as `user`, its configuration and state kept under `base`."""

    def __init__(self, base: Path, bindir: Path, user: pwd.struct_passwd) -> None:
        self.base = base
        self.bindir = bindir
        self.user = user
        self.env = {
            "PATH": f"{bindir}:/usr/bin:/bin",
            "HOME": str(base),
            "XDG_CONFIG_HOME": str(base / "config"),
            "XDG_DATA_HOME": str(base / "share"),
            "XDG_RUNTIME_DIR": str(base / "run"),
            "PG_CONFIG": str(bindir / "pg_config"),
            "LANG": "C.UTF-8",
        }

    def _as(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def run(self, *args: str, timeout: float = 90) -> str:
        r = subprocess.run(
            ["pg_autoctl", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.base,
            timeout=timeout,
            **self._as(),
        )
        if r.returncode:
            tail = "\n".join((r.stderr or r.stdout).splitlines()[-15:])
            raise RuntimeError(f"pg_autoctl {' '.join(args[:2])} failed:\n{tail}")
        return str(r.stdout)

    def spawn(self, log: Path, *args: str) -> subprocess.Popen[bytes]:
        """A pg_autoctl service in a process group of its own, with its PostgreSQL under it."""
        with log.open("ab") as out:
            return subprocess.Popen(
                ["pg_autoctl", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.base,
                start_new_session=True,
                **self._as(),
            )


@dataclass
class Node:
    name: str
    port: int
    data: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def kill(self) -> None:
        """SIGKILL, at once, to its keeper's process group (pg_autoctl and its postmaster) and
        to every process working in its data directory (each of the postmaster's children leads
        a group of its own)."""
        children = processes_in(str(self.data))
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        kill_all(children)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


class Formation:
    """The monitor and two data nodes; `up()` builds them, `down()` kills them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.user = postgres_user()
        self.ctl = Autoctl(base, pg_bindir(), self.user)
        ports = [free_port() for _ in range(3)]
        self.monitor = Node("monitor", ports[0], base / "monitor", base / "monitor.log")
        self.nodes = [
            Node(f"node{i}", ports[i], base / f"node{i}", base / f"node{i}.log") for i in (1, 2)
        ]

    @property
    def everything(self) -> list[Node]:
        return [self.monitor, *self.nodes]

    def dsn(self, node: Node, db: str = "pgworker") -> str:
        return f"postgresql://{self.user.pw_name}@127.0.0.1:{node.port}/{db}"

    @property
    def multi(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://{self.user.pw_name}@{hosts}/pgworker?target_session_attrs=read-write"

    @property
    def monitor_uri(self) -> str:
        return (
            f"postgresql://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
            "?sslmode=disable"
        )

    def _common(self, node: Node) -> list[str]:
        return [
            "--pgdata", str(node.data), "--pgport", str(node.port), "--hostname", "127.0.0.1",
            "--auth", "trust", "--no-ssl", "--pgctl", str(self.ctl.bindir / "pg_ctl"),
        ]  # fmt: skip

    def up(self) -> None:
        m = self.monitor
        self.ctl.run("create", "monitor", *self._common(m))
        self.ctl.run("config", "set", "--pgdata", str(m.data), "postgresql.listen_addresses",
                     "127.0.0.1")  # fmt: skip
        m.proc = self.ctl.spawn(m.log, "run", "--pgdata", str(m.data))
        asyncio.run(self._tune_monitor())
        for n in self.nodes:
            self.ctl.run(
                "create", "postgres", *self._common(n), "--listen", "127.0.0.1",
                "--name", n.name, "--dbname", "pgworker", "--monitor", self.monitor_uri,
                "--candidate-priority", "50", "--replication-quorum", "true",
                timeout=120,
            )  # fmt: skip
            for key, value in KEEPER_TIMEOUTS.items():
                self.ctl.run("config", "set", "--pgdata", str(n.data), key, value)
            n.proc = self.ctl.spawn(n.log, "run", "--pgdata", str(n.data))

    async def _tune_monitor(self) -> None:
        conn = await connect_until(self.dsn(self.monitor, "pg_auto_failover"), 60, "the monitor")
        try:
            for name, value in TIMEOUTS.items():
                await conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()

    def down(self) -> None:
        for n in reversed(self.everything):
            n.kill()
        kill_all(processes_in(str(self.base)))

    def check(self) -> None:
        for n in self.everything:
            if n.proc is not None and n.proc.poll() is not None:
                tail = n.log.read_text(errors="replace")[-1500:]
                raise Broken(f"pg_autoctl of {n.name} exited ({n.proc.returncode}):\n{tail}")


# The processes --------------------------------------------------------------------------------


def python_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env | extra


@dataclass
class Worker:
    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self, dsn: str, runs: Path) -> None:
        cmd = [sys.executable, "-m", "pgworker", "run", "tests.apps.failover", "--dsn", dsn]
        cmd += ["--worker-id", self.name, "--concurrency", "8", "--shutdown-timeout", "10"]
        cmd += ["--log-format", "json", *self.args]
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=python_env(FAILOVER_RUNS=str(runs)),
                cwd=ROOT,
            )

    def alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-1500:]
            code = self.proc and self.proc.returncode
            raise Broken(f"worker {self.name} exited ({code}): it was to serve on:\n{tail}")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def entries(self) -> list[dict[str, Any]]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in self.log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict):
                        out.append(entry)
        return out

    def logged(self, what: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if LOG_EVENTS[what] in str(e.get("event"))]


def _at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


def read_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


# The enqueuer ---------------------------------------------------------------------------------


async def enqueuer(dsn: str, out: Path, rate: float) -> int:
    """Enqueue `work` jobs at `rate` per second, each under an idempotency key of its own, until
    SIGTERM; append each acknowledged one to `out`. A failed enqueue is sent again, with the same
    key, on a new connection: the multi-host DSN finds the primary, whichever node it is."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    conn: asyncpg.Connection | None = None
    port = 0
    n = 0
    due = time.monotonic()
    with out.open("a", buffering=1) as acks:
        while not stop.is_set():
            key = f"failover-{n}"
            ms = LONG_MS if n % 10 == 9 else SHORT_MS
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(dsn, timeout=5)
                    port = await conn.fetchval("SELECT inet_server_port()")
                done = await asyncio.wait_for(
                    pgworker.enqueue(conn, "work", {"ms": ms, "n": n}, idempotency_key=key), 10
                )
            except Exception as exc:  # every failure is retried: the harness bounds the run
                said = {"t": time.time(), "key": key, "error": type(exc).__name__}
                print(json.dumps(said | {"message": str(exc)[:200]}), file=sys.stderr, flush=True)
                if conn is not None:
                    conn.terminate()
                    conn = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
                continue
            line = {"key": key, "id": done.job.id, "created": done.created, "t": time.time()}
            acks.write(json.dumps(line | {"port": port}) + "\n")
            n += 1
            due = max(due + 1 / rate, time.monotonic() - 1)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.monotonic()))
    if conn is not None:
        await conn.close()
    return 0


def start_enqueuer(dsn: str, out: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.failover", "enqueue", "--dsn", dsn, "--out", str(out)]
    with log.open("ab") as err:
        return subprocess.Popen(
            [*cmd, "--rate", str(RATE)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=python_env(),
            cwd=ROOT,
        )


# The run --------------------------------------------------------------------------------------


async def connect_until(dsn: str, timeout: float, what: str) -> asyncpg.Connection:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise Broken(f"{what}: no connection within {timeout:.0f} s ({exc})") from None
            await asyncio.sleep(0.2)


@dataclass
class Run:
    """What the run measured, as far as it got."""

    rows: list[tuple[str, Any]] = field(default_factory=list)
    t_kill: float = 0.0

    def since(self, t: float | None) -> str:
        return "-" if t is None else f"{t - self.t_kill:.1f} s"


async def formed(f: Formation, run: Run) -> None:
    """Wait for node1 primary and node2 its synchronous standby, as the monitor and the primary
    say."""
    mon = await connect_until(f.dsn(f.monitor, "pg_auto_failover"), 30, "the monitor")
    try:

        async def states() -> bool:
            f.check()
            rows = await mon.fetch(
                "SELECT nodename, reportedstate, goalstate FROM pgautofailover.node"
            )
            got = {r["nodename"]: (r["reportedstate"], r["goalstate"]) for r in rows}
            want = {"node1": ("primary",) * 2, "node2": ("secondary",) * 2}
            return got == want

        await wait_until("node1 primary and node2 secondary (the monitor)", states, 90)
    finally:
        await mon.close()
    conn = await connect_until(f.dsn(f.nodes[0]), 30, "node1")
    try:

        async def synchronous() -> asyncpg.Record | None:
            row = await conn.fetchrow(
                "SELECT current_setting('synchronous_standby_names') AS names,"
                " current_setting('synchronous_commit') AS sc,"
                " (SELECT string_agg(application_name || ' ' || sync_state, ', ')"
                "  FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) AS standbys"
            )
            return row if row is not None and row["names"] and row["standbys"] else None

        sync = await wait_until("node2 a synchronous standby of node1", synchronous, 30)
        run.rows.append(("PostgreSQL", await conn.fetchval("SHOW server_version")))
        run.rows.append(
            ("replication", f"synchronous_standby_names = {sync['names']}; {sync['standbys']};"
                            f" synchronous_commit = {sync['sc']}")
        )  # fmt: skip
        if sync["sc"] not in ("on", "remote_apply", "remote_write"):
            raise Broken(f"synchronous_commit is {sync['sc']}: commits do not wait for the standby")
    finally:
        await conn.close()


async def scenario(f: Formation, run: Run, logs: Path) -> None:
    primary = f.nodes[0]
    await formed(f, run)
    r = subprocess.run(
        [sys.executable, "-m", "pgworker", "migrate", "--dsn", f.dsn(primary)],
        capture_output=True, text=True, env=python_env(), cwd=ROOT, timeout=60,
    )  # fmt: skip
    if r.returncode:
        raise Broken(f"pgworker migrate on the primary failed: {r.stderr[-1500:]}")
    runs, acked_file = logs / "runs.jsonl", logs / "acked.jsonl"
    workers = [
        Worker("w1", [], logs / "w1.log"),
        Worker("w2", ["--durable-claims", "--lease", str(LEASE_W2)], logs / "w2.log"),
    ]
    for w in workers:  # every worker serves the default queue, and one queue of its own
        w.args += ["--queue", "default", "--queue", f"hold-{w.name}"]
    enq: subprocess.Popen[bytes] | None = None
    try:
        for w in workers:
            w.start(f.multi, runs)
        enq = start_enqueuer(f.multi, acked_file, logs / "enqueuer.log")
        await serve(f, run, workers, enq, runs, acked_file)
        if (code := enq.wait(timeout=20)) != 0:
            raise Broken(f"the enqueuer exited {code} at SIGTERM")
        for w in workers:
            if (stopped := w.stop()) != 0:
                raise Broken(f"worker {w.name} exited {stopped} at SIGTERM")
        await reconcile(f, run, workers, runs, acked_file)
    finally:
        if enq is not None and enq.poll() is None:
            enq.kill()
            enq.wait()
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()


async def serve(
    f: Formation,
    run: Run,
    workers: list[Worker],
    enq: subprocess.Popen[bytes],
    runs: Path,
    acked_file: Path,
) -> None:
    """Steady work on node1, its kill, the failover, steady work on node2; the enqueuer stopped
    once it has acknowledged AFTER_KILL enqueues since the kill."""
    primary, standby = f.nodes
    conn = await connect_until(f.dsn(primary), 30, "node1")
    pids = {w.name: w.proc.pid for w in workers if w.proc is not None}
    try:

        async def steady() -> asyncpg.Record | None:
            for w in workers:
                w.alive()
            if enq.poll() is not None:
                raise Broken(f"the enqueuer exited ({enq.returncode}) before the kill")
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'completed') AS completed,"
                " count(*) FILTER (WHERE status = 'running') AS running,"
                " count(DISTINCT worker_id) FILTER (WHERE status = 'completed') AS served,"
                " count(*) AS jobs FROM pgworker.jobs"
            )
            assert row is not None
            busy = row["completed"] >= 80 and row["served"] == 2 and row["running"] >= 4
            return row if busy else None

        before = await wait_until("both workers busy on node1", steady, 60, every=0.05)
        # A job longer than the failover on each worker, in its own queue, claimed now.
        with acked_file.open("a") as out:
            for w in workers:
                key = f"hold-{w.name}"
                done = await pgworker.enqueue(
                    conn, "work", {"ms": HOLD_MS}, queue=key, idempotency_key=key
                )
                line = {"key": key, "id": done.job.id, "created": done.created, "t": time.time()}
                out.write(json.dumps(line | {"port": primary.port}) + "\n")

        async def holding() -> bool:
            n = await conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs WHERE queue LIKE 'hold-%'"
                " AND status = 'running' AND queue = 'hold-' || worker_id"
            )
            return bool(n == len(workers))

        await wait_until("each worker running its long job", holding, 10, every=0.02)
        run.rows.append(
            ("before the kill", f"{before['jobs']} jobs, {before['completed']} completed,"
                                f" {before['running']} running, and a {HOLD_MS / 1000:g} s one"
                                " on each worker")
        )  # fmt: skip
    finally:
        await conn.close()

    run.t_kill = time.time()
    primary.kill()

    # The multi-host DSN finds the new primary.
    async def writable() -> float | None:
        with contextlib.suppress(Exception):
            c = await asyncpg.connect(f.multi, timeout=2)
            try:
                port = await c.fetchval("SELECT inet_server_port()")
                if port != standby.port:
                    raise Broken(f"read-write after the kill on port {port}, not node2's")
                return time.time()
            finally:
                await c.close()
        return None

    t_writable = await wait_until("node2 read-write", writable, 90, every=0.1)
    # What node2 wrote is what came after its promotion: a write acknowledged by node1 in the
    # moment between the kill's start and its end can carry a later time than the kill's start.
    promoted, accepted = await promotion(f)
    if promoted is None and accepted is None:
        raise Broken("node2 takes writes, yet the monitor recorded no promotion of it")
    on_node2 = promoted or accepted or run.t_kill
    conn = await connect_until(f.dsn(standby), 10, "node2")
    try:

        async def first_completion() -> float | None:
            at: float | None = await conn.fetchval(
                "SELECT extract(epoch FROM min(finished_at))::float8 FROM pgworker.job_attempts"
                " WHERE outcome = 'completed' AND finished_at > to_timestamp($1)",
                on_node2,
            )
            return at

        t_first = await wait_until("a job completed on node2", first_completion, 60)

        async def acked_since() -> bool:
            if enq.poll() is not None:
                raise Broken(f"the enqueuer exited ({enq.returncode}) during the failover")
            acked: int = sum(a["port"] == standby.port for a in read_lines(acked_file))
            return acked >= AFTER_KILL

        await wait_until(f"{AFTER_KILL} enqueues acknowledged by node2", acked_since, 60)
        enq.send_signal(signal.SIGTERM)
        acks = read_lines(acked_file)
        t_ack = min((a["t"] for a in acks if a["port"] == standby.port), default=None)
        ids = [a["id"] for a in acks]
        promoted, accepted = await promotion(f)  # wait_primary is reported once writes are on
        run.rows += [
            ("kill -> node2 promoted (read-only)", run.since(promoted)),
            ("kill -> node2 takes writes", run.since(accepted)),
            ("kill -> read-write on the DSN", run.since(t_writable)),
            ("kill -> first enqueue acknowledged by node2", run.since(t_ack)),
            ("kill -> first job completed on node2", run.since(t_first)),
        ]

        async def drained() -> bool:
            for w in workers:
                w.alive()
            n = await conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1) AND status <> 'completed'",
                ids,
            )
            return bool(n == 0)

        try:
            await wait_until("every acknowledged job completed", drained, 60)
        except Broken as exc:
            left = await conn.fetch(
                "SELECT id, status, attempts, worker_id, error FROM pgworker.jobs"
                " WHERE id = ANY($1) AND status <> 'completed' ORDER BY id LIMIT 10",
                ids,
            )
            raise Broken(f"{exc}: {[dict(r) for r in left]}") from None

        # The same processes serve, and each completed jobs on node2.
        registered = {
            r["worker_id"]: r["pid"]
            for r in await conn.fetch("SELECT worker_id, pid FROM pgworker.workers")
        }
        firsts = {
            r["worker_id"]: r["at"]
            for r in await conn.fetch(
                "SELECT worker_id, extract(epoch FROM min(finished_at))::float8 AS at"
                " FROM pgworker.job_attempts WHERE outcome = 'completed'"
                " AND finished_at > to_timestamp($1) GROUP BY worker_id",
                on_node2,
            )
        }
    finally:
        await conn.close()
    for w in workers:
        w.alive()
        if registered.get(w.name) != pids[w.name]:
            raise Broken(
                f"worker {w.name}: pid {pids[w.name]} started, {registered.get(w.name)} registered"
                " on node2"
            )
        if w.name not in firsts:
            raise Broken(f"worker {w.name} completed no job on node2")
    for w in workers:
        fenced, resumed = w.logged("fence"), w.logged("resume")
        how = "no fence"
        if fenced:
            how = f"fenced itself at {run.since(_at(fenced[0]))}, " + (
                f"resumed at {run.since(_at(resumed[-1]))}" if resumed else "never resumed"
            )
        run.rows.append(
            (f"  {w.name} (pid {pids[w.name]}, same process)",
             f"first completion {run.since(firsts[w.name])}; {how}")
        )  # fmt: skip


async def promotion(f: Formation) -> tuple[float | None, float | None]:
    """When the monitor saw node2 promoted (stop_replication: a primary still read-only, while
    the old one may not have demoted itself) and taking writes (wait_primary)."""
    mon = await connect_until(f.dsn(f.monitor, "pg_auto_failover"), 10, "the monitor")
    try:
        rows = await mon.fetch(
            "SELECT reportedstate, extract(epoch FROM min(eventtime))::float8 AS at"
            " FROM pgautofailover.event WHERE nodename = 'node2'"
            " AND reportedstate IN ('stop_replication', 'wait_primary', 'primary')"
            " GROUP BY reportedstate"
        )
    finally:
        await mon.close()
    at = {r["reportedstate"]: r["at"] for r in rows}
    return at.get("stop_replication"), at.get("wait_primary", at.get("primary"))


async def reconcile(
    f: Formation, run: Run, workers: list[Worker], runs_file: Path, acked_file: Path
) -> None:
    """Every acknowledged enqueue completed once on node2; every other run explained."""
    acks = read_lines(acked_file)
    conn = await connect_until(f.dsn(f.nodes[1]), 10, "node2")
    try:
        jobs = {
            r["idempotency_key"]: r
            for r in await conn.fetch(
                "SELECT id, idempotency_key, status, (result->>'attempt')::int AS result_attempt"
                " FROM pgworker.jobs"
            )
        }
        attempts: dict[int, list[asyncpg.Record]] = {}
        for att in await conn.fetch(
            "SELECT job_id, attempt, started_at, outcome, worker_id, error_type, error_message"
            " FROM pgworker.job_attempts ORDER BY job_id, attempt, started_at"
        ):
            attempts.setdefault(att["job_id"], []).append(att)
    finally:
        await conn.close()
    wrong: list[str] = []
    for a in acks:
        j = jobs.get(a["key"])
        if j is None or j["id"] != a["id"]:
            wrong.append(f"acknowledged {a['key']} (job {a['id']}): on node2 {j and dict(j)}")
        elif j["status"] != "completed":
            wrong.append(f"acknowledged job {a['id']}: {j['status']} on node2")
    acked_ids = {a["id"] for a in acks}
    extra = [j["id"] for j in jobs.values() if j["id"] not in acked_ids]

    starts: dict[int, list[dict[str, Any]]] = {}
    for line in read_lines(runs_file):
        if line["event"] == "start":
            starts.setdefault(line["job"], []).append(line)
    said = {
        (w.name, what): {(e.get("job_id"), e.get("attempt")) for e in w.logged(what)}
        for w in workers
        for what in ("lease_lost", "dropped")
    }
    fast = {w.name for w in workers if "--durable-claims" not in w.args}
    rescued = undone = 0
    for job_id in sorted(acked_ids):
        rows = attempts.get(job_id, [])
        done = [r for r in rows if r["outcome"] == "completed"]
        if len(done) != 1:
            wrong.append(f"job {job_id}: {len(done)} completed attempts: {_outcomes(rows)}")
            continue
        j = next(j for j in jobs.values() if j["id"] == job_id)
        if j["result_attempt"] != done[0]["attempt"]:
            wrong.append(f"job {job_id}: its result names attempt {j['result_attempt']}, its"
                         f" completed attempt is {done[0]['attempt']}")  # fmt: skip
        by_claim = {(r["attempt"], r["started_at"]): r for r in rows}
        for s in starts.get(job_id, []):
            claimed = datetime.fromisoformat(s["claimed_at"])
            row = by_claim.get((s["attempt"], claimed))
            if row is not None:
                if row["outcome"] == "completed":
                    continue
                if row["outcome"] == "lost":
                    rescued += 1
                    continue
                wrong.append(f"job {job_id}: run of attempt {s['attempt']} by {s['worker']}"
                             f" ended {row['outcome']}: {row['error_type']}")  # fmt: skip
            elif s["worker"] not in fast:
                wrong.append(
                    f"job {job_id}: a run of attempt {s['attempt']} by {s['worker']} (durable"
                    f" claims) has no attempt row on node2: {_outcomes(rows)}"
                )
            elif claimed.timestamp() > run.t_kill:
                wrong.append(f"job {job_id}: a run by {s['worker']} claimed after the kill has"
                             f" no attempt row on node2")  # fmt: skip
            elif any(
                (job_id, s["attempt"]) in said[s["worker"], what]
                for what in ("lease_lost", "dropped")
            ):
                undone += 1
            else:
                wrong.append(
                    f"job {job_id}: a run of attempt {s['attempt']} by {s['worker']} has no"
                    f" attempt row on node2, and its worker's log does not say it lost it"
                )
        if not starts.get(job_id):
            wrong.append(f"job {job_id}: completed, but no run of its handler was recorded")
    if wrong:
        raise Broken(f"{len(wrong)} promises broken:\n    " + "\n    ".join(wrong[:12]))
    run.rows += [
        ("acknowledged enqueues", f"{len(acks)} (all on node2, completed)"),
        ("  retried across the failover", _retried(acked_file.parent / "enqueuer.log")),
        ("completed", f"{len(acked_ids)} jobs, each exactly once"),
        ("reruns", f"{rescued + undone}: {rescued} rescued (attempt `lost`, lease expired),"
                   f" {undone} fast claims undone (no attempt row; the worker logged it)"),
    ]  # fmt: skip
    if extra:
        run.rows.append(("jobs never acknowledged", f"{len(extra)}: {extra[:5]}"))


def _outcomes(rows: list[asyncpg.Record]) -> list[str]:
    return [f"{r['attempt']}:{r['outcome']}@{r['worker_id']}" for r in rows]


def _retried(log: Path) -> str:
    errors = read_lines(log)
    kinds: dict[str, int] = {}
    for e in errors:
        kinds[e.get("error", "?")] = kinds.get(e.get("error", "?"), 0) + 1
    return f"{len(errors)} failed tries ({', '.join(f'{k} {v}' for k, v in kinds.items())})"


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if len(sys.argv) > 1 and sys.argv[1] == "enqueue":
        p = argparse.ArgumentParser(prog="python -m tests.failover enqueue")
        p.add_argument("enqueue")
        p.add_argument("--dsn", required=True)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--rate", type=float, default=RATE)
        a = p.parse_args()
        return asyncio.run(enqueuer(a.dsn, a.out, a.rate))
    if not shutil.which("pg_autoctl"):
        print("failover: skipped: no pg_autoctl (apt-get install postgresql-NN-auto-failover)")
        return 0
    arm(BUDGET)
    started = time.monotonic()
    left = clean_earlier()
    if left:
        print(f"failover: removed what an earlier run left: {', '.join(left)}")
    base = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-"))
    logs = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-logs-", dir=base))
    run = Run()
    failure = ""
    formation: Formation | None = None
    try:
        formation = Formation(base)
        user = formation.user
        os.chown(base, user.pw_uid, user.pw_gid)
        formation.up()
        ports = ", ".join(f"{n.name} {n.port}" for n in formation.everything)
        run.rows.append(("pg_auto_failover", f"monitor and 2 nodes on 127.0.0.1 ({ports})"))
        tuned = [f"{k.split('.')[-1]} {v}" for k, v in (TIMEOUTS | KEEPER_TIMEOUTS).items()]
        run.rows.append(("  timeouts", ", ".join(tuned) or "pg_auto_failover's defaults"))
        asyncio.run(scenario(formation, run, logs))
    except Skip as exc:
        print(f"failover: skipped: {exc}")
        return 0
    except Exception as exc:  # Broken, Stopped, or the harness's own trouble: the table so far
        failure = ended(exc)
    finally:
        disarm()
        if formation is not None:
            formation.down()
        if failure:  # the logs of a failed run are kept, beside the removed cluster
            kept = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-logs-"))  # the next run removes it
            for path in [*logs.iterdir(), *base.glob("*.log")]:
                shutil.copy(path, kept / path.name)
            logs = kept
        shutil.rmtree(base, ignore_errors=True)
    took = time.monotonic() - started
    print(
        f"\nfailover: a primary killed under 2 workers (w1: defaults; w2: --durable-claims,"
        f" lease {LEASE_W2:g} s) and an enqueuer ({RATE:g}/s) on a multi-host DSN"
        + (f"; logs in {logs}" if failure else "")
    )
    width = max((len(k) for k, _ in run.rows), default=0)
    for k, v in run.rows:
        print(f"  {k.ljust(width)}  {v}")
    print(f"  {'took'.ljust(width)}  {took:.0f} s")
    if failure:
        print(f"FAILED: {failure}")
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
