"""`make chaos`: a long soak. At least 50,000 jobs through 4 `pgworker run` processes while workers
are SIGKILLed and restarted, their backends terminated and jobs cancelled at random, and the
PostgreSQL server crashed (an immediate stop, then a restart: claims that had not reached the disk
are undone); then a reconciliation table. Bounded in time; exits 1 when the table does not
reconcile.

A few jobs per thousand are poison (`poison-*` in tests/apps/chaos.py: an exception whose
`__str__` raises, a handler's own SystemExit, KeyboardInterrupt or CancelledError, a lone
surrogate or a 5,000-deep value in the result, `Retry(after=1e13)`, a sync handler calling
`sys.exit(1)`): each must end in its documented state (`POISON`), and no worker may exit but
those the soak kills itself (every other exit is listed, with the end of its log, and fails the
table; the exited worker is restarted so that the load goes on). Server crashes and backend
terminations hit a serving fleet: before each, the soak waits (bounded) until every restarted
worker has registered, since a worker whose start-up fails (its server down, its connection cut)
exits by design with one line, `DatabaseUnavailable` (README, "Start-up").

Runs on a throwaway PostgreSQL cluster of its own (local binaries, else the embedded package), or
on SOAK_DSN when set (then without server crashes). SOAK_JOBS, SOAK_WORKERS, SOAK_SECONDS,
SOAK_SEED, SOAK_POISON (the share of poison jobs, default 0.004) and SOAK_MIN_STEPS (the chaos
steps it takes at least, topping the jobs up when the fleet drains them first) tune it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

import pgworker
from examples import devdb
from pgworker import JobSpec

from .helpers import spawn_worker

JOBS = int(os.environ.get("SOAK_JOBS", "50000"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "4"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "900"))
SEED = int(os.environ.get("SOAK_SEED", str(int(time.time()))))
POISON_SHARE = float(os.environ.get("SOAK_POISON", "0.004"))
CRASH_STEPS = (2, 5)
MIN_STEPS = int(os.environ.get("SOAK_MIN_STEPS", "24"))
"""The chaos steps a soak takes at least: a fleet that drains the jobs first gets more of them
(TOP_UP at a time), so that a faster worker never makes the soak a quiet drain."""
TOP_UP = 5000


def _failed_with(check: Callable[[str], bool]) -> Callable[[str, str | None, Any], bool]:
    return lambda status, error, result: status == "failed" and error is not None and check(error)


def _completed_with(check: Callable[[Any], bool]) -> Callable[[str, str | None, Any], bool]:
    return lambda status, error, result: status == "completed" and check(result)


# Each poison type: (the documented end of its job: status, error, result as JSON, `None` when
# NULL), (the error of each of its failed or retried attempts, `None` for types that complete).
POISON: dict[str, tuple[Callable[[str, str | None, Any], bool], Callable[[str], bool] | None]] = {
    "poison-unprintable": (
        _failed_with(lambda e: e.startswith("Unprintable: <") and "RuntimeError" in e),
        lambda e: e.startswith("Unprintable: <") and "RuntimeError" in e,
    ),
    "poison-system-exit": (_failed_with("SystemExit: 3".__eq__), "SystemExit: 3".__eq__),
    "poison-keyboard-interrupt": (
        _failed_with("KeyboardInterrupt".__eq__),
        "KeyboardInterrupt".__eq__,
    ),
    "poison-own-cancel": (
        _failed_with(lambda e: e.startswith("CancelledError")),
        lambda e: e.startswith("CancelledError"),
    ),
    "poison-surrogate": (
        _completed_with(lambda r: isinstance(r, dict) and r.get("text") == "bad \ufffd byte"),
        None,
    ),
    "poison-deep": (_completed_with(lambda r: r is None), None),
    "poison-retry-far": (
        _failed_with(lambda e: e.startswith("ValidationError: after: must be at most")),
        lambda e: e.startswith("ValidationError: after: must be at most"),
    ),
    "poison-sync-exit": (_failed_with("SystemExit: 1".__eq__), "SystemExit: 1".__eq__),
}


class Fleet:
    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn, self.logs = dsn, logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.names: dict[int, str] = {}
        self.started = 0
        self.killed: set[int] = set()  # the pids the soak SIGKILLed itself
        self.unexpected: list[str] = []  # every other exit: name, pid, status, end of its log

    def start(self, slot: int) -> None:
        self.started += 1
        name = f"w{slot}-{self.started}"
        self.names[slot] = name
        self.procs[slot] = spawn_worker(
            "tests.apps.chaos",
            self.dsn,
            self.logs / f"{name}.log",
            "--worker-id",
            name,
            "--lease",
            "2",
            "--concurrency",
            "10",
            "--log-format",
            "json",
            "--log-level",
            "warning",
            env={"CHAOS_DSN": self.dsn},
        )

    def kill(self, slot: int) -> None:
        """SIGKILL the worker of `slot` (an exit caused on purpose) and start another."""
        proc = self.procs[slot]
        self.killed.add(proc.pid)
        proc.kill()
        code = proc.wait()
        if code != -signal.SIGKILL:  # it had exited on its own before the signal
            self._exited(slot, code)
        self.start(slot)

    def check(self) -> None:
        """Record every worker that exited without the soak killing it, and restart it."""
        for slot, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None and proc.pid not in self.killed:
                self._exited(slot, code)
                self.start(slot)

    def _exited(self, slot: int, code: int | None, why: str = "exited on its own") -> None:
        name = self.names[slot]
        lines = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()
        tail = [line if len(line) < 400 else line[:400] + " …" for line in lines[-8:]]
        self.unexpected.append(
            f"{name} (pid {self.procs[slot].pid}) {why}, status {code}; its log ends:\n      "
            + "\n      ".join(tail)
        )

    async def serving(self, conn: asyncpg.Connection, timeout: float = 30) -> None:
        """Wait (bounded) until every worker has started: registered, and its listener has
        said hello (the last step of a worker's start-up), so that neither SIGTERM nor a cut
        finds it starting."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = await conn.fetchval(
                "SELECT count(*) FROM pgworker.workers w WHERE w.worker_id = ANY($1)"
                " AND EXISTS (SELECT FROM pg_stat_activity a"
                "             WHERE a.application_name = 'pgworker-listen:' || w.worker_id"
                "               AND a.state = 'idle' AND a.query LIKE '%pg_notify%')",
                list(self.names.values()),
            )
            if seen == len(self.names):
                return
            await asyncio.sleep(0.1)

    def stop(self) -> list[int | None]:
        """SIGTERM every worker; each must exit 0 (an exit status other than 0 is recorded)."""
        self.check()
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        codes = []
        for slot, p in self.procs.items():
            try:
                code: int | None = p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.killed.add(p.pid)
                p.kill()
                p.wait()
                code = None
            codes.append(code)
            if code != 0:
                self._exited(slot, code, "at SIGTERM")
        return codes


def count_in_logs(logs: Path, text: str) -> int:
    return sum(f.read_text(errors="replace").count(text) for f in logs.iterdir() if f.is_file())


def log_levels(logs: Path) -> dict[str, int]:
    """Worker log lines by level (`error` and `critical` only); lines that are not JSON (a
    traceback printed past the structured logs) are counted as `raw`."""
    levels: dict[str, int] = {}
    for f in logs.iterdir():
        for line in f.read_text(errors="replace").splitlines():
            try:
                level = str(json.loads(line).get("level"))
            except (ValueError, AttributeError):
                level = "raw"
            if level in ("error", "critical", "raw"):
                levels[level] = levels.get(level, 0) + 1
    return levels


async def reconcile_poison(conn: asyncpg.Connection) -> tuple[list[tuple[str, str]], int]:
    """Per poison type: how many jobs ended as documented, cancelled (a cancel request of the
    soak's), or failed as lost (their only or last attempt's worker was SIGKILLed, retries
    spent), and how many did not (with examples); returns the table's rows and the number of
    jobs or attempts that did not end as documented."""
    jobs = await conn.fetch(
        """SELECT j.id, j.type, j.status, j.error, j.result::text AS result,
                  j.cancel_requested_at IS NOT NULL AS cancel_requested,
                  coalesce(array_agg(a.outcome || ' ' || coalesce(a.error_type, '')
                                     || coalesce(': ' || nullif(a.error_message, ''), ''))
                           FILTER (WHERE a.outcome IN ('failed', 'retried')), '{}') AS errors
           FROM pgworker.jobs j LEFT JOIN pgworker.job_attempts a ON a.job_id = j.id
           WHERE j.type LIKE 'poison-%'
           GROUP BY j.id ORDER BY j.id"""
    )
    rows: list[tuple[str, str]] = []
    wrong: list[str] = []
    for type_, (ends, attempt_error) in POISON.items():
        mine = [j for j in jobs if j["type"] == type_]
        documented = cancelled = lost = 0
        for j in mine:
            result = None if j["result"] is None else json.loads(j["result"])
            bad = [
                e
                for e in j["errors"]
                if attempt_error is None or not attempt_error(e.split(" ", 1)[1])
            ]
            if bad:
                wrong.append(f"job {j['id']} ({type_}): attempt {bad[0]!r}")
            elif ends(j["status"], j["error"], result):
                documented += 1
            elif j["status"] == "cancelled" and j["cancel_requested"]:
                cancelled += 1
            elif j["status"] == "failed" and (j["error"] or "").startswith("WorkerLost"):
                lost += 1
            else:
                wrong.append(
                    f"job {j['id']} ({type_}): {j['status']}, error {j['error']!r},"
                    f" result {(j['result'] or '')[:80]!r}"
                )
        rows.append(
            (
                f"  {type_}",
                f"{len(mine)} jobs: {documented} as documented, {cancelled} cancelled, {lost} lost",
            )
        )
    rows.append(("  not as documented", len(wrong)))
    rows.extend(("    " + w.split(":", 1)[0], w.split(":", 1)[1].strip()) for w in wrong[:10])
    return rows, len(wrong)


async def enqueue(conn: asyncpg.Connection, rand: random.Random, first: int, count: int) -> int:
    """`count` jobs numbered from `first`: mostly `work`, a few poison, refusing and effect
    jobs; returns `count`."""
    for start in range(first, first + count, 5000):
        specs = []
        for n in range(start, min(start + 5000, first + count)):
            kind = rand.random()
            if kind < POISON_SHARE:
                specs.append(JobSpec(rand.choice(list(POISON)), {"n": n}))
            elif kind < 0.02:
                specs.append(JobSpec("refuse", {"n": n}, max_retries=0))
            elif kind < 0.04:
                specs.append(JobSpec("effect", {"n": n}))
            else:
                specs.append(JobSpec("work", {"n": n, "ms": rand.choice([0, 0, 1, 5, 20])}))
        await pgworker.enqueue_many(conn, specs)
    return count


async def soak(dsn: str, logs: Path, crash: Callable[[], None] | None = None) -> bool:
    """`crash`, when given, crashes the server and restarts it, at the steps of CRASH_STEPS."""
    rand = random.Random(SEED)
    conn = await asyncpg.connect(dsn)
    await pgworker.migrate(conn)
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS chaos_effects (job_id bigint PRIMARY KEY, attempt int)"
    )
    await conn.execute("TRUNCATE pgworker.jobs, pgworker.job_attempts, chaos_effects")
    t0 = time.monotonic()
    enqueued = await enqueue(conn, rand, 0, JOBS)
    enqueue_s = time.monotonic() - t0

    fleet = Fleet(dsn, logs)
    for slot in range(WORKERS):
        fleet.start(slot)
    kills = terminations = cancels = crashes = steps = 0
    deadline = time.monotonic() + SECONDS
    t1 = time.monotonic()
    while time.monotonic() < deadline:
        left = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        )
        if left == 0:
            if steps >= MIN_STEPS:
                break
            enqueued += await enqueue(conn, rand, enqueued, TOP_UP)
        await asyncio.sleep(rand.uniform(1.0, 3.0))
        fleet.check()
        action = rand.random()
        steps += 1
        if crash is not None and steps in CRASH_STEPS:
            await fleet.serving(conn)
            await asyncio.to_thread(crash)
            crashes += 1
            conn = await asyncpg.connect(dsn)
        elif action < 0.35:
            fleet.kill(rand.randrange(WORKERS))
            kills += 1
        elif action < 0.7:
            await fleet.serving(conn)
            terminations += await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name LIKE 'pgworker%' AND pid <> pg_backend_pid()"
            )
        else:
            ids = await conn.fetch(
                "SELECT id FROM pgworker.jobs WHERE status IN ('pending', 'running')"
                " ORDER BY random() LIMIT 5"
            )
            for r in ids:
                await pgworker.cancel(conn, r["id"])
                cancels += 1
    drain_s = time.monotonic() - t1
    await fleet.serving(conn)
    exits = fleet.stop()

    counts = {
        r["status"]: r["n"]
        for r in await conn.fetch("SELECT status, count(*) AS n FROM pgworker.jobs GROUP BY status")
    }
    outcomes = {
        r["outcome"]: r["n"]
        for r in await conn.fetch(
            "SELECT outcome, count(*) AS n FROM pgworker.job_attempts GROUP BY outcome"
        )
    }
    again = await conn.fetchrow(
        """SELECT count(*) AS ran_again,
                  count(*) FILTER (WHERE EXISTS (
                      SELECT FROM pgworker.job_attempts a
                      WHERE a.job_id = j.id AND a.outcome IN ('lost', 'interrupted', 'retried')
                  )) AS explained
           FROM pgworker.jobs j WHERE j.attempts > 1"""
    )
    duplicate_effects = await conn.fetchval(
        "SELECT count(*) FROM chaos_effects e JOIN pgworker.jobs j ON j.id = e.job_id"
        " WHERE j.type <> 'effect'"
    )
    effects = await conn.fetchval("SELECT count(*) FROM chaos_effects")
    retried = await conn.fetch(
        "SELECT job_id, attempt, error_type, error_message FROM pgworker.job_attempts"
        " WHERE outcome = 'retried' AND type NOT LIKE 'poison-%' ORDER BY job_id, attempt"
        " LIMIT 10"
    )
    effect_jobs_done = await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE type = 'effect' AND status = 'completed'"
    )
    poison_rows, poison_wrong = await reconcile_poison(conn)
    await conn.close()

    dropped = await asyncio.to_thread(count_in_logs, logs, "outcome dropped")
    levels = await asyncio.to_thread(log_levels, logs)
    done = sum(counts.get(s, 0) for s in ("completed", "failed", "cancelled"))
    rows = [
        ("enqueued", enqueued),
        ("completed", counts.get("completed", 0)),
        ("failed", counts.get("failed", 0)),
        ("cancelled", counts.get("cancelled", 0)),
        ("completed + failed + cancelled", done),
        ("left pending", counts.get("pending", 0)),
        ("left running", counts.get("running", 0)),
        ("jobs run more than once", again["ran_again"]),
        ("  of which explained by a lost, interrupted or retried attempt", again["explained"]),
        ("effect jobs completed / effect rows", f"{effect_jobs_done} / {effects}"),
        ("attempts by outcome", ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items()))),
        ("poison jobs, by type", ""),
        *poison_rows,
        ("workers SIGKILLed and restarted", kills),
        ("worker exits not caused by the soak", len(fleet.unexpected)),
        ("backends terminated", terminations),
        ("server crashes", crashes),
        ("late outcomes fenced (worker logs)", dropped),
        ("cancel requests", cancels),
        ("worker exit codes at SIGTERM", exits),
        (
            "worker log lines: error, critical, not JSON",
            ", ".join(str(levels.get(k, 0)) for k in ("error", "critical", "raw")),
        ),
        ("chaos steps (at least MIN_STEPS)", f"{steps} ({MIN_STEPS})"),
        ("enqueue time / drain time", f"{enqueue_s:.1f} s / {drain_s:.1f} s"),
        ("seed", SEED),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nsoak: {enqueued} jobs, {WORKERS} worker processes")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    for exit_ in fleet.unexpected:
        print(f"  worker exit: {exit_}")
    for r in retried:
        print(
            f"  retried: job {r['job_id']} attempt {r['attempt']}: {r['error_type']}: "
            f"{r['error_message']}"
        )
    ok = (
        done == enqueued
        and steps >= MIN_STEPS
        and (crash is None or crashes == len(CRASH_STEPS))
        and counts.get("pending", 0) == 0
        and counts.get("running", 0) == 0
        and again["ran_again"] == again["explained"]
        and outcomes.get("running", 0) == 0
        and duplicate_effects == 0
        and effects >= effect_jobs_done
        and all(code == 0 for code in exits)
        and not fleet.unexpected
        and poison_wrong == 0
    )
    print("RECONCILED" if ok else "NOT RECONCILED")
    return ok


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)
    logs = Path(tempfile.mkdtemp(prefix="pgw-soak-logs-"))
    print(f"worker logs in {logs}; seed {SEED}")
    if os.environ.get("SOAK_DSN"):
        return 0 if asyncio.run(soak(os.environ["SOAK_DSN"], logs)) else 1
    data = tempfile.mkdtemp(prefix="pgw-soak-")
    bindir = devdb.local_bindir()
    cluster = devdb.Cluster(data, bindir=bindir) if bindir else devdb.Cluster(data)
    dsn = cluster.start()

    def crash() -> None:
        cluster.stop("immediate")
        cluster.start()

    try:
        return 0 if asyncio.run(soak(dsn, logs, crash)) else 1
    finally:
        cluster.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
