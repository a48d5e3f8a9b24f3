"""`make chaos`: a long soak. At least 50,000 jobs through 4 `pgworker run` processes while workers
are SIGKILLed and restarted, their backends terminated and jobs cancelled at random, and the
PostgreSQL server crashed (an immediate stop, then a restart: claims that had not reached the disk
are undone); then a reconciliation table. Bounded in time; exits 1 when the table does not
reconcile.

Runs on a throwaway PostgreSQL cluster of its own (local binaries, else the embedded package), or
on SOAK_DSN when set (then without server crashes). SOAK_JOBS, SOAK_WORKERS, SOAK_SECONDS and
SOAK_SEED tune it.
"""

from __future__ import annotations

import asyncio
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

import asyncpg

import pgworker
from pgworker import JobSpec, devdb

from .helpers import spawn_worker

JOBS = int(os.environ.get("SOAK_JOBS", "50000"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "4"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "900"))
SEED = int(os.environ.get("SOAK_SEED", str(int(time.time()))))
CRASH_STEPS = (2, 5)


class Fleet:
    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn, self.logs = dsn, logs
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.names: dict[int, str] = {}
        self.started = 0

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

    async def serving(self, conn: asyncpg.Connection, timeout: float = 30) -> None:
        """Wait (bounded) until every worker has registered, so that SIGTERM finds it serving."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = await conn.fetchval(
                "SELECT count(*) FROM pgworker.workers WHERE worker_id = ANY($1)",
                list(self.names.values()),
            )
            if seen == len(self.names):
                return
            await asyncio.sleep(0.1)

    def stop(self) -> list[int | None]:
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs.values():
            try:
                codes.append(p.wait(timeout=60))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(None)
        return codes


def count_in_logs(logs: Path, text: str) -> int:
    return sum(f.read_text(errors="replace").count(text) for f in logs.iterdir() if f.is_file())


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
    for start in range(0, JOBS, 5000):
        specs = []
        for n in range(start, min(start + 5000, JOBS)):
            kind = rand.random()
            if kind < 0.02:
                specs.append(JobSpec("refuse", {"n": n}, max_retries=0))
            elif kind < 0.04:
                specs.append(JobSpec("effect", {"n": n}))
            else:
                specs.append(JobSpec("work", {"n": n, "ms": rand.choice([0, 0, 1, 5, 20])}))
        await pgworker.enqueue_many(conn, specs)
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
            break
        await asyncio.sleep(rand.uniform(1.0, 3.0))
        action = rand.random()
        steps += 1
        if crash is not None and steps in CRASH_STEPS:
            await asyncio.to_thread(crash)
            crashes += 1
            conn = await asyncpg.connect(dsn)
        elif action < 0.35:
            slot = rand.randrange(WORKERS)
            fleet.procs[slot].kill()
            fleet.procs[slot].wait()
            fleet.start(slot)
            kills += 1
        elif action < 0.7:
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
        " WHERE outcome = 'retried' ORDER BY job_id, attempt LIMIT 10"
    )
    effect_jobs_done = await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE type = 'effect' AND status = 'completed'"
    )
    await conn.close()

    dropped = await asyncio.to_thread(count_in_logs, logs, "outcome dropped")
    done = sum(counts.get(s, 0) for s in ("completed", "failed", "cancelled"))
    rows = [
        ("enqueued", JOBS),
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
        ("workers SIGKILLed and restarted", kills),
        ("backends terminated", terminations),
        ("server crashes", crashes),
        ("late outcomes fenced (worker logs)", dropped),
        ("cancel requests", cancels),
        ("worker exit codes at SIGTERM", exits),
        ("enqueue time / drain time", f"{enqueue_s:.1f} s / {drain_s:.1f} s"),
        ("seed", SEED),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nsoak: {JOBS} jobs, {WORKERS} worker processes")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    for r in retried:
        print(
            f"  retried: job {r['job_id']} attempt {r['attempt']}: {r['error_type']}: "
            f"{r['error_message']}"
        )
    ok = (
        done == JOBS
        and counts.get("pending", 0) == 0
        and counts.get("running", 0) == 0
        and again["ran_again"] == again["explained"]
        and outcomes.get("running", 0) == 0
        and duplicate_effects == 0
        and effects >= effect_jobs_done
        and all(code == 0 for code in exits)
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
