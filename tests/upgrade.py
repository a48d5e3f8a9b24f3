"""`make upgrade`: a rolling deploy from the previous release to this tree, on one database.

docs/operations/versions.md promises that workers of the previous release keep working on the
schema the new release's `pgworker migrate` leaves, side by side with the new ones, until they
are replaced. This run does such a deploy and checks what it promises:

1. The previous release is built from git: UPGRADE_FROM (a commit, default the last release)
   `git archive`d into a temporary folder and pip-installed into a throwaway virtualenv. The
   working tree, in the main virtualenv, is the new release.
2. In a database of its own (created and dropped on PGWORKER_DSN), the OLD release migrates and
   two old workers (`old-a`, `old-b`) serve tests/apps/upgrade.py; an old enqueuer enqueues
   plain jobs, jobs that fail once then succeed, scheduled ones, long ones, parents and their
   dependants, and unique jobs, without a pause.
3. The NEW release's `pgworker migrate` runs while both old workers work; a new worker (`new-n`)
   and a new enqueuer start beside them; the new `pgworker status` runs while the old workers are
   registered.
4. `old-a` gets SIGTERM while it holds jobs (it must finish them and exit 0); then `old-b` is
   SIGKILLed while it holds jobs: once their lease has passed, `new-n` (the only worker left)
   must rescue them and run them again. The enqueuers stop; `new-n` drains the queue alone.
5. Every acknowledged enqueue ran to completion exactly once; a job that ran more than once has
   an attempt row saying why for every other run (its planned failure, or `lost`: its lease
   lapsed and it was rescued); no job is lost. The handlers' runs are counted from files each
   worker writes (not from the database checked), and each names the code that ran it: an old
   worker must run the old release's code. The old workers must have completed jobs after the
   migration, the new worker jobs of the old enqueuer and the old workers jobs of the new one.

Prints a table (jobs per worker and release, reruns and their reasons, times) and exits 1 when a
promise broke, saying which; when the old release cannot run on the new schema at all (a worker
exits, or stops completing jobs), it says so with the worker's log, within bounds: every wait has
a limit, and the whole run BUDGET seconds. Cleans up (its processes, database and folders)
whatever happens, SIGTERM and SIGINT included, and at start what a crashed earlier run left.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from . import harness
from .harness import Broken, arm, disarm, ended

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FROM = "f0523a3"
"""The last release that landed; UPGRADE_FROM (or --from) names another."""
ADMIN_DSN = os.environ.get("PGWORKER_DSN") or "postgresql://postgres@127.0.0.1:5432/postgres"
PREFIX = "pgworker_upgrade_"
APP = "tests.apps.upgrade"
SCRIPT = ROOT / "tests" / "apps" / "upgrade.py"
LEASE = float(os.environ.get("UPGRADE_LEASE", "2"))
CONCURRENCY = 8
RATE = 20.0
"""Enqueues a second per enqueuer."""
BUDGET = 240
MIN_AFTER = 10
"""The least jobs the old workers must complete after the new migrations, and the new worker
beside them, before the old ones are stopped."""
PLANNED = "planned failure of the first attempt"
BREAK = os.environ.get("UPGRADE_BREAK", "")
"""`old-claims` breaks the run on purpose, to see it fail: right after the new migrations, a
trigger makes every claim by an old worker raise, as a migration that broke the previous
release's claim would. The run must then fail, saying the old workers stopped completing jobs and
what they logged, within its bounds."""
BREAK_SQL = """
CREATE FUNCTION pgworker.upgrade_break() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'claims by the previous release broken on purpose (UPGRADE_BREAK)';
END $$;
CREATE TRIGGER upgrade_break BEFORE UPDATE ON pgworker.jobs FOR EACH ROW
    WHEN (NEW.status = 'running' AND NEW.worker_id LIKE 'old-%')
    EXECUTE FUNCTION pgworker.upgrade_break();
"""


def with_db(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# The releases ---------------------------------------------------------------------------------


@dataclass
class Release:
    name: str  # "old" or "new"
    label: str  # the commit, or "working tree"
    bin: Path  # its virtualenv's bin folder
    code: str = ""  # the folder its pgworker is imported from
    version: str = ""
    schema: int = 0  # the schema version its migrations reached

    def exe(self, what: str) -> str:
        return str(self.bin / what)


def build_old(commit: str, into: Path) -> tuple[Release, float]:
    """The release at `commit`: `git archive` into `into/src`, a virtualenv in `into/venv`."""
    started = time.monotonic()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if rev.returncode:
        raise Broken(
            f"commit {commit!r} is not in this clone (a shallow clone? `git fetch --unshallow`);"
            " UPGRADE_FROM names the release to upgrade from"
        )
    full = rev.stdout.strip()
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", full], capture_output=True)
    if archive.returncode:
        raise Broken(f"git archive {full}: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    # A virtualenv without pip of its own (its ensurepip takes longer than the install), filled
    # by this interpreter's pip (`--python`): the same index, and its cache makes it quick.
    venv = into / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
    )
    target = str(venv / "bin" / "python")
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", target, "install", "--quiet", str(src)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if pip.returncode:
        tail = (pip.stderr or pip.stdout).strip().splitlines()[-15:]
        raise Broken(f"pip install of {commit} failed:\n    " + "\n    ".join(tail))
    old = Release("old", commit, venv / "bin")
    describe(old)
    return old, time.monotonic() - started


def describe(r: Release) -> None:
    """Fill in what the release's own interpreter says of itself."""
    probe = (
        "import json, os, pgworker;"
        " print(json.dumps({'code': os.path.dirname(os.path.abspath(pgworker.__file__)),"
        " 'version': pgworker.__version__}))"
    )
    # Run from an empty folder: the repository's root on sys.path would import this tree.
    out = subprocess.run(
        [r.exe("python"), "-c", probe],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=child_env(),
        check=True,
    )
    found = json.loads(out.stdout)
    r.code, r.version = found["code"], found["version"]


def child_env(**more: str) -> dict[str, str]:
    """The environment of every process started: no pgworker settings of the caller's, no
    PYTHONPATH (it could put this tree in front of the old release)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PGWORKER_") and k not in ("DATABASE_URL", "PYTHONPATH")
    }
    return {**env, **more}


# The processes --------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    release: Release
    log: Path
    cmd: list[str]
    env: dict[str, str]
    cwd: Path = ROOT
    proc: subprocess.Popen[bytes] | None = None
    out: Path | None = None

    def start(self) -> None:
        with self.log.open("ab") as err:
            stdout = self.out.open("ab") if self.out else subprocess.DEVNULL
            try:
                self.proc = subprocess.Popen(
                    self.cmd,
                    stdout=stdout,
                    stderr=err,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            finally:
                if self.out:
                    stdout.close()  # type: ignore[union-attr]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def term(self, timeout: float) -> int | None:
        """SIGTERM, then the exit status within `timeout` (None: it did not exit)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, n: int = 25) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n      ".join(lines[-n:])

    def entries(self) -> list[dict[str, Any]]:
        out = []
        if self.log.exists():
            for line in self.log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict):
                        out.append(entry)
        return out


def worker(name: str, r: Release, logs: Path, dsn: str) -> Proc:
    cmd = [r.exe("pgworker"), "run", APP, "--dsn", dsn, "--worker-id", name]
    cmd += ["--lease", f"{LEASE:g}", "--concurrency", str(CONCURRENCY), "--poll-interval", "0.5"]
    cmd += ["--shutdown-timeout", "15", "--log-format", "json", "--log-level", "info"]
    env = child_env(UPGRADE_RUNS_DIR=str(logs))
    return Proc(name, r, logs / f"{name}.log", cmd, env)


def enqueuer(r: Release, logs: Path, dsn: str) -> Proc:
    # Run by path with -P (neither the repository's root, which holds this tree's pgworker, nor
    # the script's folder, whose tests/apps/secrets.py hides the standard library's, on sys.path).
    cmd = [r.exe("python"), "-P", str(SCRIPT), "enqueue", dsn, r.name, f"{RATE:g}"]
    name = f"enqueuer-{r.name}"
    p = Proc(name, r, logs / f"{name}.log", cmd, child_env(), cwd=Path(tempfile.gettempdir()))
    p.out = logs / f"{name}.jsonl"
    return p


def cli(r: Release, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [r.exe("pgworker"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        cwd=tempfile.gettempdir(),
    )


# The run --------------------------------------------------------------------------------------


async def wait_until(
    what: str,
    check: Callable[[], Awaitable[Any]],
    timeout: float,
    watch: list[Proc] = (),  # type: ignore[assignment]
    every: float = 0.1,
) -> Any:
    """harness.wait_until, and Broken as soon as one of `watch` exits, with its log."""

    async def watched() -> Any:
        for p in watch:
            if p.proc is not None and p.proc.poll() is not None:
                raise Broken(
                    f"{p.name} ({p.release.name} release) exited with {p.proc.returncode} while"
                    f" waiting for {what}; its log ends:\n      {p.tail()}"
                )
        return await check()

    return await harness.wait_until(what, watched, timeout, every)


@dataclass
class Run:
    old: Release
    new: Release
    logs: Path
    dsn: str
    rows: list[tuple[str, Any]] = field(default_factory=list)
    table: list[list[str]] = field(default_factory=list)
    procs: dict[str, Proc] = field(default_factory=dict)
    migrate_started: float = 0.0  # the database's clock when the new release's migrate began
    migrated_at: float = 0.0  # the database's clock when the new migrations had committed
    t_stop_a: float = 0.0
    held_at_term: list[tuple[int, int]] = field(default_factory=list)  # old-a's, at SIGTERM
    t_kill_b: float = 0.0
    killed_attempts: list[tuple[int, int]] = field(default_factory=list)
    leases: dict[int, float] = field(default_factory=dict)  # when old-b's leases ran out

    def watch(self, *names: str) -> list[Proc]:
        return [self.procs[n] for n in names if n in self.procs]

    async def completed_by(self, conn: asyncpg.Connection, workers: list[str], since: float) -> int:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM pgworker.job_attempts WHERE worker_id = ANY($1)"
            " AND outcome = 'completed' AND finished_at > to_timestamp($2)",
            workers,
            since,
        )
        return n

    async def crossed(self, conn: asyncpg.Connection) -> dict[tuple[str, str], int]:
        """Completed attempts per (release of the enqueuer, release of the worker)."""
        rows = await conn.fetch(
            "SELECT j.payload->>'by' AS by, a.worker_id LIKE 'old-%' AS old, count(*) AS n"
            " FROM pgworker.job_attempts a JOIN pgworker.jobs j ON j.id = a.job_id"
            " WHERE a.outcome = 'completed' GROUP BY 1, 2"
        )
        return {(r["by"], "old" if r["old"] else "new"): r["n"] for r in rows}

    async def leader(self, conn: asyncpg.Connection) -> str:
        """The maintenance leader (who rescues expired leases, among other chores)."""
        name = await conn.fetchval(
            "SELECT worker_id FROM pgworker.leader WHERE name = 'maintenance'"
            " AND expires_at > now()"
        )
        return f"{name} ({'old' if str(name).startswith('old-') else 'new'} release)"

    async def holding(self, conn: asyncpg.Connection, name: str) -> list[tuple[int, int]]:
        rows = await conn.fetch(
            "SELECT j.id, j.attempts FROM pgworker.jobs j"
            " WHERE j.status = 'running' AND j.worker_id = $1 AND j.type = 'hold'",
            name,
        )
        return [(r["id"], r["attempts"]) for r in rows]


async def scenario(run: Run) -> None:
    old = run.old
    migrate = cli(old, "migrate", "--dsn", run.dsn)
    if migrate.returncode:
        raise Broken(f"the old release's migrate failed: {migrate.stderr.strip()}")
    conn = await asyncpg.connect(run.dsn)
    try:
        old.schema = await conn.fetchval("SELECT max(version) FROM pgworker.migrations")
        await _scenario(run, conn)
    finally:
        await conn.close()


async def _scenario(run: Run, conn: asyncpg.Connection) -> None:
    old, new, logs, dsn = run.old, run.new, run.logs, run.dsn
    for p in (
        worker("old-a", old, logs, dsn),
        worker("old-b", old, logs, dsn),
        enqueuer(old, logs, dsn),
    ):
        run.procs[p.name] = p
        p.start()
    olds = ["old-a", "old-b"]

    async def registered(names: list[str]) -> bool:
        n = await conn.fetchval(
            "SELECT count(*) FROM pgworker.workers WHERE worker_id = ANY($1)", names
        )
        return bool(n == len(names))

    everyone = run.watch("old-a", "old-b", "enqueuer-old")
    await wait_until("the old workers registered", lambda: registered(olds), 60, everyone)
    t0 = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")

    async def old_served() -> bool:
        return await run.completed_by(conn, olds, t0) >= 2 * MIN_AFTER

    await wait_until("the old workers completing the old enqueuer's jobs", old_served, 30, everyone)

    # The new release's migrations, while the old workers work.
    run.migrate_started = await conn.fetchval(
        "SELECT extract(epoch FROM clock_timestamp())::float8"
    )
    started = time.monotonic()
    try:
        migrate = cli(new, "migrate", "--dsn", dsn, timeout=90)
    except subprocess.TimeoutExpired:
        raise Broken(
            "the new release's migrate did not end within 90 s beside the old workers"
        ) from None
    took = time.monotonic() - started
    if migrate.returncode:
        raise Broken(
            "the new release's migrate failed beside the old workers:\n      "
            + migrate.stderr.strip().replace("\n", "\n      ")
        )
    run.migrated_at = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    new.schema = await conn.fetchval("SELECT max(version) FROM pgworker.migrations")
    if BREAK == "old-claims":
        await conn.execute(BREAK_SQL)
    applied = await conn.fetch(
        "SELECT version, name FROM pgworker.migrations WHERE version > $1 ORDER BY version",
        old.schema,
    )
    names = ", ".join(str(r["version"]) for r in applied) or "none"
    run.rows.append(("new migrations, old workers running", f"{names} in {took:.1f} s"))

    for p in (worker("new-n", new, logs, dsn), enqueuer(new, logs, dsn)):
        run.procs[p.name] = p
        p.start()
    everyone = run.watch("old-a", "old-b", "new-n", "enqueuer-old", "enqueuer-new")
    await wait_until("the new worker registered", lambda: registered(["new-n"]), 60, everyone)

    # The new release's status, with the old workers registered.
    status = cli(new, "status", "--dsn", dsn)
    as_json = cli(new, "status", "--dsn", dsn, "--json")
    if status.returncode or as_json.returncode:
        bad = status if status.returncode else as_json
        raise Broken(
            f"the new release's `pgworker status` failed with old workers registered"
            f" ({bad.returncode}): {bad.stderr.strip()}"
        )
    missing = [w for w in ("old-a", "old-b", "new-n") if w not in status.stdout]
    try:
        json.loads(as_json.stdout)
    except ValueError:
        raise Broken(
            f"`pgworker status --json` printed no JSON: {as_json.stdout[:300]!r}"
        ) from None
    if missing:
        raise Broken(f"`pgworker status` does not list the workers {missing}:\n{status.stdout}")
    run.rows.append(("new `pgworker status`, old workers registered", "ok (lists old-a, old-b)"))
    leader = await run.leader(conn)
    run.rows.append(("maintenance leader after the migration", leader))

    # Replace rather than restart: an old worker started after the migration refuses to.
    late = worker("old-late", old, logs, dsn)
    run.procs[late.name] = late
    late.start()
    assert late.proc is not None
    try:
        refused = late.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        refused = None
    if refused in (None, 0) or "newer" not in late.log.read_text(errors="replace"):
        late.kill()
        raise Broken(
            f"an old worker started after the migration did not refuse the newer schema"
            f" (exit {refused}); its log:\n      {late.tail()}"
        )
    run.rows.append(("old worker started after the migration", f"refused (exit {refused})"))

    # Old and new side by side: the old workers go on after the migration, each release
    # completes the other's enqueues.
    async def side_by_side() -> bool:
        after = await run.completed_by(conn, olds, run.migrated_at)
        by_new = await run.completed_by(conn, ["new-n"], run.migrated_at)
        crossed = await run.crossed(conn)
        return (
            after >= MIN_AFTER
            and by_new >= MIN_AFTER
            and crossed.get(("old", "new"), 0) > 0
            and crossed.get(("new", "old"), 0) > 0
        )

    try:
        await wait_until("old and new workers side by side", side_by_side, 30, everyone)
    except Broken as exc:
        after = await run.completed_by(conn, olds, run.migrated_at)
        said = "\n      ".join(f"{n}: {logged(run.procs[n], 5) or 'nothing'}" for n in olds)
        raise Broken(
            f"{exc}: the old workers completed {after} jobs after the migration (at least"
            f" {MIN_AFTER} expected), crossed completions {await run.crossed(conn)}; the old"
            f" workers' warnings and errors:\n      {said}"
        ) from None

    # old-a: SIGTERM while it holds jobs; it finishes them and exits.
    a, b = run.procs["old-a"], run.procs["old-b"]
    await wait_until(
        "old-a holding long jobs", lambda: run.holding(conn, "old-a"), 20, everyone, 0.02
    )
    run.t_stop_a = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    held = await conn.fetch(
        "SELECT job_id, attempt FROM pgworker.job_attempts"
        " WHERE worker_id = 'old-a' AND outcome = 'running'"
    )
    status_a = a.term(timeout=30)
    run.held_at_term = [(r["job_id"], r["attempt"]) for r in held]
    if status_a != 0:
        raise Broken(f"old-a exited {status_a} at SIGTERM (0 expected); its log:\n      {a.tail()}")
    run.rows.append(
        (
            "old-a stopped by SIGTERM",
            f"attempts running: {len(held)}; exited 0 in {time.time() - run.t_stop_a:.1f} s",
        )
    )

    # old-b: SIGKILL while it holds jobs; new-n, the only worker left, rescues them.
    everyone = run.watch("old-b", "new-n", "enqueuer-old", "enqueuer-new")
    await wait_until(
        "old-b holding long jobs", lambda: run.holding(conn, "old-b"), 20, everyone, 0.02
    )
    b.kill()
    run.t_kill_b = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())::float8")
    everyone = run.watch("new-n", "enqueuer-old", "enqueuer-new")
    open_at_kill = await conn.fetch(
        "SELECT a.job_id, a.attempt, extract(epoch FROM j.lease_expires_at)::float8 AS lease"
        " FROM pgworker.job_attempts a JOIN pgworker.jobs j ON j.id = a.job_id"
        " WHERE a.worker_id = 'old-b' AND a.outcome = 'running'"
    )
    run.killed_attempts = [(r["job_id"], r["attempt"]) for r in open_at_kill]
    run.leases = {r["job_id"]: r["lease"] for r in open_at_kill}

    async def rescued() -> bool:
        left = await conn.fetchval(
            "SELECT count(*) FROM pgworker.job_attempts"
            " WHERE worker_id = 'old-b' AND outcome = 'running'"
        )
        return bool(left == 0)

    try:
        await wait_until("old-b's jobs rescued", rescued, 4 * LEASE + 15, everyone)
    except Broken as exc:
        tail = run.procs["new-n"].tail()
        raise Broken(f"{exc}; the new worker's log ends:\n      {tail}") from None
    rescue_s = time.time() - run.t_kill_b
    by = await run.leader(conn)
    run.rows.append(
        (
            "old-b SIGKILLed",
            f"attempts open: {len(run.killed_attempts)}; rescued in {rescue_s:.1f} s by the"
            f" leader, {by}",
        )
    )

    # The enqueuers stop; new-n drains alone.
    await asyncio.sleep(1)
    for name in ("enqueuer-old", "enqueuer-new"):
        p = run.procs[name]
        code = p.term(timeout=20)
        if code != 0:
            raise Broken(f"{name} exited {code} (0 expected); its log:\n      {p.tail()}")

    async def drained() -> bool:
        n = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        )
        return bool(n == 0)

    started = time.monotonic()
    try:
        await wait_until("the queue drained by the new worker", drained, 60, run.watch("new-n"))
    except Broken as exc:
        left = await conn.fetch(
            "SELECT id, type, status, worker_id, attempts, run_at FROM pgworker.jobs"
            " WHERE status IN ('pending', 'running') ORDER BY id LIMIT 10"
        )
        raise Broken(f"{exc}; left: {[dict(r) for r in left]}") from None
    run.rows.append(("drained by new-n alone", f"{time.monotonic() - started:.1f} s"))
    code = run.procs["new-n"].term(timeout=30)
    if code != 0:
        raise Broken(f"new-n exited {code} at SIGTERM; its log:\n      {run.procs['new-n'].tail()}")
    await reconcile(run, conn)


async def grouped(run: Run, conn: asyncpg.Connection, wrong: list[str]) -> None:
    """Failures grouped by cause (migration 30), where the schema has them: the old workers'
    failures from before the migration by its backfill, the new worker's by its outcome write;
    those the old workers write after it carry none (as upgrading.md says), but the new leader's
    rescues of their attempts."""
    has = await conn.fetchval(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'pgworker'"
        " AND table_name = 'job_attempts' AND column_name = 'error_group'"
    )
    if not has:
        return
    rows = await conn.fetch(
        "SELECT CASE WHEN worker_id = 'new-n' THEN 'new-n'"
        " WHEN finished_at < to_timestamp($1) THEN 'old until then (backfilled)'"
        " ELSE 'old from 1 s before migrate' END AS who,"
        " count(*) AS n, count(error_group) AS grouped"
        " FROM pgworker.job_attempts WHERE error_type IS NOT NULL GROUP BY 1 ORDER BY 1",
        # An outcome written just before the migration may have waited for its lock and
        # committed after the backfill: a second of margin.
        run.migrate_started - 1,
    )
    for r in rows:
        if r["who"] != "old from 1 s before migrate" and r["grouped"] != r["n"]:
            wrong.append(f"failures of the {r['who']}: {r['grouped']} of {r['n']} grouped")
    shown = ", ".join(f"{r['who']}: {r['grouped']} of {r['n']}" for r in rows)
    run.rows.append(("failures with an error group", shown or "none"))


def logged(p: Proc, most: int = 3) -> str:
    """The warnings and errors `p` logged, the most frequent first, each with its error."""
    events = Counter(
        f"{e.get('event')}" + (f" ({str(e['error'])[:120]})" if e.get("error") else "")
        for e in p.entries()
        if e.get("level") in ("warning", "error", "critical")
    )
    return "; ".join(f"{n} x {event!r}" for event, n in events.most_common(most))


def trouble(run: Run) -> str:
    """The warnings and errors each worker logged, by event."""
    return ", ".join(f"{n}: {logged(run.procs[n]) or 'none'}" for n in ("old-a", "old-b", "new-n"))


def acknowledged(p: Proc, r: Release) -> list[dict[str, Any]]:
    """The enqueuer's acknowledged enqueues; Broken when it ran another release's code."""
    assert p.out is not None
    lines = [json.loads(line) for line in p.out.read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("code") != r.code:
        raise Broken(f"{p.name} ran pgworker from {lines[:1]}, not {r.code}")
    return lines[1:]


def runs(run: Run) -> list[dict[str, Any]]:
    """Every handler run, from the files the workers wrote."""
    out = []
    for f in run.logs.glob("runs-*.jsonl"):
        for line in f.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


async def reconcile(run: Run, conn: asyncpg.Connection) -> None:
    old, new = run.old, run.new
    release = {"old-a": old, "old-b": old, "new-n": new}
    acks = acknowledged(run.procs["enqueuer-old"], old) + acknowledged(
        run.procs["enqueuer-new"], new
    )
    jobs = {
        r["id"]: r
        for r in await conn.fetch(
            "SELECT id, type, status, attempts, payload, result,"
            " extract(epoch FROM run_at)::float8 AS run_at FROM pgworker.jobs"
        )
    }
    attempts: dict[int, list[asyncpg.Record]] = defaultdict(list)
    for a in await conn.fetch(
        "SELECT job_id, attempt, worker_id, outcome, error_type, error_message,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM finished_at)::float8 AS finished"
        " FROM pgworker.job_attempts ORDER BY job_id, attempt"
    ):
        attempts[a["job_id"]].append(a)
    ran: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs(run):
        ran[r["job"], r["attempt"]].append(r)

    wrong: list[str] = []
    ids = {a["id"] for a in acks}
    lost = sorted(ids - jobs.keys())
    if lost:
        wrong.append(f"{len(lost)} acknowledged jobs are not in the table: {lost[:10]}")
    # Runs: each one an attempt row of the same worker, the code of that worker's release.
    for (job, attempt), rs in ran.items():
        rows = [a for a in attempts.get(job, []) if a["attempt"] == attempt]
        if len(rs) > 1:
            wrong.append(f"job {job} attempt {attempt} ran {len(rs)} times: {rs}")
        if not rows or rows[0]["worker_id"] != rs[0]["worker"]:
            wrong.append(f"job {job}: a run without its attempt row: {rs[0]}, rows {rows}")
        w = rs[0]["worker"]
        if w in release and rs[0]["code"] != release[w].code:
            wrong.append(f"job {job}: {w} ran the code in {rs[0]['code']}, not {release[w].code}")
    reasons: Counter[str] = Counter()
    per_worker: dict[str, Counter[str]] = defaultdict(Counter)
    for job_id in sorted(ids & jobs.keys()):
        j, rows = jobs[job_id], attempts.get(job_id, [])
        done = [a for a in rows if a["outcome"] == "completed"]
        if j["status"] != "completed" or len(done) != 1:
            wrong.append(
                f"job {job_id} ({j['type']}): {j['status']}, attempts"
                f" {[(a['worker_id'], a['outcome']) for a in rows]}"
            )
            continue
        if (job_id, done[0]["attempt"]) not in ran:
            wrong.append(f"job {job_id}: completed by attempt {done[0]['attempt']}, never run")
        payload = json.loads(j["payload"]) if isinstance(j["payload"], str) else j["payload"]
        result = json.loads(j["result"]) if isinstance(j["result"], str) else j["result"]
        w = done[0]["worker_id"]
        if result.get("code") != release[w].code:
            wrong.append(f"job {job_id}: completed by {w}, its result from {result.get('code')}")
        per_worker[w]["completed"] += 1
        per_worker[w][f"by {payload['by']}"] += 1
        if done[0]["finished"] > run.migrated_at:
            per_worker[w]["after migrate"] += 1
        for a in rows:
            if a is done[0]:
                continue
            if a["outcome"] == "lost":
                reasons["lost lease, rescued"] += 1
                per_worker[a["worker_id"]]["lost"] += 1
            elif a["outcome"] == "interrupted":
                reasons["handed back at shutdown"] += 1
            elif (
                a["outcome"] == "retried"
                and a["attempt"] == 1
                and payload.get("fail_once")
                and PLANNED in (a["error_message"] or "")
            ):
                reasons["planned failure, retried"] += 1
            else:
                wrong.append(
                    f"job {job_id}: attempt {a['attempt']} on {a['worker_id']} ended"
                    f" {a['outcome']} ({a['error_type']}: {a['error_message']}), no reason known"
                )
    # Scheduled jobs not before their time; dependants not before their parent completed.
    early = 0
    for ack in acks:
        rows = attempts.get(ack["id"], [])
        if not rows:
            continue
        if ack["kind"] == "scheduled" and rows[0]["started"] < ack["run_at"] - 0.05:
            early += 1
            wrong.append(
                f"job {ack['id']}: started {ack['run_at'] - rows[0]['started']:.2f} s early"
            )
        if ack["kind"] == "child":
            parent = [a for a in attempts.get(ack["parent"], []) if a["outcome"] == "completed"]
            if not parent or rows[0]["started"] < parent[0]["finished"]:
                wrong.append(f"job {ack['id']}: started before its parent {ack['parent']} ended")
    # The stopped worker's attempts: finished by it, within its grace period.
    for job_id, attempt in run.held_at_term:
        mine = [a for a in attempts.get(job_id, []) if a["attempt"] == attempt]
        if not mine or mine[0]["outcome"] != "completed":
            wrong.append(f"job {job_id}: old-a's attempt {attempt} at SIGTERM ended {mine}")
    # Unique keys: a second enqueue of a waiting job's key gives that job back.
    first: dict[str, dict[str, Any]] = {}
    deduplicated = 0
    for ack in acks:
        if ack["kind"] != "unique":
            continue
        if ack["key"] not in first:
            first[ack["key"]] = ack
        elif not ack["created"]:
            deduplicated += 1
            if ack["id"] != first[ack["key"]]["id"]:
                wrong.append(f"unique key {ack['key']}: gave back job {ack['id']}, not the first")
    # The killed worker's attempts: lost, and run again on the new worker.
    for job_id, attempt in run.killed_attempts:
        rows = attempts.get(job_id, [])
        mine = [a for a in rows if a["attempt"] == attempt]
        later = [a for a in rows if a["attempt"] > attempt]
        if not mine or mine[0]["outcome"] != "lost":
            wrong.append(f"job {job_id}: old-b's attempt {attempt} not lost: {mine}")
        elif mine[0]["finished"] < run.leases.get(job_id, run.t_kill_b):
            early_s = run.leases[job_id] - mine[0]["finished"]
            wrong.append(f"job {job_id}: rescued {early_s:.2f} s before its lease ran out")
        if not later or later[0]["worker_id"] != "new-n":
            wrong.append(f"job {job_id}: old-b's attempt not run again by new-n: {later}")
    for name in ("old-a", "old-b"):
        if per_worker[name]["after migrate"] == 0:
            wrong.append(f"{name} completed no job after the new migrations")
    if per_worker["new-n"]["by old"] == 0:
        wrong.append("the new worker completed no job of the old enqueuer")
    if sum(per_worker[n]["by new"] for n in ("old-a", "old-b")) == 0:
        wrong.append("the old workers completed no job of the new enqueuer")

    for rel in (old, new):
        k = Counter(a["kind"] for a in acks if a["by"] == rel.name)
        shown = ", ".join(f"{n} {kind}" for kind, n in sorted(k.items()))
        run.rows.append(
            (f"acknowledged enqueues, {rel.name} enqueuer", f"{sum(k.values())} ({shown})")
        )
    run.rows.append(("unique keys enqueued twice", f"{len(first)}, {deduplicated} given back"))
    extra = sorted(jobs.keys() - ids)
    run.rows.append(("jobs in the table", f"{len(jobs)}; {len(extra)} never acknowledged"))
    run.rows.append(
        (
            "completed exactly once",
            f"{sum(c['completed'] for c in per_worker.values())} of {len(ids)}",
        )
    )
    shown = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())) or "none"
    run.rows.append(("runs past the first, with their reason", shown))
    run.table.append(
        ["worker", "release", "completed", "after migrate", "old enq.", "new enq.", "lost"]
    )
    for name in ("old-a", "old-b", "new-n"):
        c = per_worker[name]
        run.table.append(
            [
                name,
                release[name].name,
                str(c["completed"]),
                str(c["after migrate"]),
                str(c["by old"]),
                str(c["by new"]),
                str(c["lost"]),
            ]
        )
    run.rows.append(("warnings and errors logged", trouble(run)))
    await grouped(run, conn, wrong)
    if wrong:
        raise Broken(f"{len(wrong)} promises broken:\n    " + "\n    ".join(wrong[:15]))


# Set-up and clean-up --------------------------------------------------------------------------


async def create_db(name: str) -> str:
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        for r in await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE $1", PREFIX + "%"
        ):
            pid = r["datname"][len(PREFIX) :]
            if pid.isdigit() and not _alive(int(pid)):  # what a crashed earlier run left
                await conn.execute(f'DROP DATABASE IF EXISTS "{r["datname"]}" WITH (FORCE)')
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_db(ADMIN_DSN, name)


async def drop_db(name: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def clean_folders() -> None:
    for d in Path(tempfile.gettempdir()).glob("pgworker-upgrade-*"):
        found = re.search(r"-(\d+)-", d.name)
        if found and not _alive(int(found.group(1))):
            shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    p = argparse.ArgumentParser(prog="python -m tests.upgrade", description=__doc__.split("\n")[0])
    p.add_argument(
        "--from",
        dest="commit",
        default=os.environ.get("UPGRADE_FROM") or DEFAULT_FROM,
        help=f"the release to upgrade from, a commit (default: $UPGRADE_FROM, else {DEFAULT_FROM})",
    )
    args = p.parse_args()
    arm(BUDGET)
    started = time.monotonic()
    clean_folders()
    work = Path(tempfile.mkdtemp(prefix=f"pgworker-upgrade-{os.getpid()}-"))
    logs = work / "logs"
    logs.mkdir()
    name = f"{PREFIX}{os.getpid()}"
    new = Release("new", "working tree", Path(sys.executable).parent)
    run: Run | None = None
    rows: list[tuple[str, Any]] = []
    failure = ""
    db_made = False
    try:
        describe(new)
        old, took = build_old(args.commit, work)
        rows.append(("old release built (git archive, venv, pip)", f"{took:.1f} s"))
        dsn = asyncio.run(create_db(name))
        db_made = True
        run = Run(old, new, logs, dsn, rows)
        asyncio.run(scenario(run))
    except Exception as exc:  # Broken, Stopped, or the harness's own trouble: the table so far
        failure = ended(exc)
    finally:
        disarm()
        if run is not None:
            for proc in run.procs.values():
                proc.kill()
        if db_made:
            with contextlib.suppress(Exception):
                asyncio.run(drop_db(name))
    took = time.monotonic() - started
    old_label = args.commit
    if run is not None:
        o, n = run.old, run.new
        print(
            f"\nupgrade: {old_label} ({o.version}, schema {o.schema}) -> working tree"
            f" ({n.version}, schema {n.schema}); lease {LEASE:g} s, concurrency {CONCURRENCY},"
            f" {RATE:g} enqueues/s per enqueuer"
        )
    else:
        print(f"\nupgrade: {old_label} -> working tree")
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    if run is not None and run.table:
        widths = [max(len(r[i]) for r in run.table) for i in range(len(run.table[0]))]
        for r in run.table:
            print(
                "  "
                + "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))
                )
            )
    print(f"  {'took'.ljust(width)}  {took:.0f} s")
    if failure:
        keep = logs if run is not None else None
        print(f"FAILED: {failure}")
        if keep is not None:
            kept = Path(tempfile.gettempdir()) / f"pgworker-upgrade-logs-{os.getpid()}"
            shutil.copytree(keep, kept, dirs_exist_ok=True)
            print(f"  (the processes' logs are kept in {kept})")
        shutil.rmtree(work, ignore_errors=True)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
