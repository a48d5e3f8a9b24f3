"""What every measurement stands on: the processes and databases a run starts (all cleaned up
whatever happens), the CPU figures' helpers, and what was measured (versions, git revisions).

Nothing here knows a queue library: the systems (bench/systems/) and the workloads
(bench/workloads.py) are built on it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench.procstat import machine_busy, parent

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


class BenchError(RuntimeError):
    pass


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


def src_env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src)}


def imported_from(src: Path) -> str:
    """The file of the `pgworker` package that a subprocess run from `src` imports."""
    return subprocess.run(
        [sys.executable, "-c", "import pgworker; print(pgworker.__file__)"],
        cwd=src,
        env=src_env(src),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


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


# --- CPU: whose processes count, and at which instants ------------------------------------------


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


async def wait_quiet(quiet_wait: float, quiet_cores: float) -> None:
    """Wait (at most `quiet_wait` seconds) until the machine's cores are nearly idle over one
    second, so that another program's burst does not land in a measurement."""
    deadline = time.monotonic() + quiet_wait
    said = False
    while True:
        b0, t0 = machine_busy(), time.monotonic()
        await asyncio.sleep(1.0)
        cores = (machine_busy() - b0) / (time.monotonic() - t0)
        if cores <= quiet_cores:
            return
        if time.monotonic() > deadline:
            log(f"  machine still busy ({cores:.2f} cores in use); measuring anyway")
            return
        if not said:
            log(f"  machine busy ({cores:.2f} cores in use by others): waiting for it to calm down")
            said = True


# --- what was measured ----------------------------------------------------------------------------


def git_rev(where: Path = REPO) -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    return ""


async def versions(dsn: str, sources: dict[str, Path | None]) -> dict[str, str]:
    """The versions measured; `sources` maps a system to the checkout it runs from, if any,
    which is checked to be what its subprocesses really import."""
    conn = await asyncpg.connect(dsn)
    try:
        server = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    out = {}
    # pgworker is distributed as pgworker-queue (as pgworker before that name was chosen).
    names = {"pgworker": ("pgworker-queue", "pgworker")}
    for system in ("pgworker", "procrastinate", "pgqueuer", "chancy", "asyncpg", "psycopg"):
        out[system] = "not installed"
        for dist in names.get(system, (system,)):
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[system] = metadata.version(dist)
                break
    rev = git_rev()
    if rev:
        out["pgworker"] += f" (git {rev})"
    try:
        import psycopg

        out["psycopg"] += f" ({psycopg.pq.__impl__})"
    except ImportError:
        pass
    for name, src in sources.items():
        if src:
            imported = imported_from(src)
            if not Path(imported).is_relative_to(src):
                raise BenchError(f"{name}: a subprocess run from {src} imports {imported}")
            out[f"{name} measured"] = f"git {git_rev(src)}, imports {imported}"
    out["PostgreSQL"] = server
    out["Python"] = platform.python_version()
    return out
