"""Chaos: real `pgworker run` processes, broken at chosen points, then reconciled."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

import pgworker
from examples import devdb
from pgworker import JobSpec

from .helpers import all_finished, attempts, spawn_worker, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Workers:
    """Worker processes of one test, all killed at the end whatever happens."""

    def __init__(self, dsn: str, logs: Path, module: str = "tests.apps.chaos") -> None:
        self.dsn = dsn
        self.logs = logs
        self.module = module
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        chaos = ("--worker-id", name, "--log-format", "json")
        proc = spawn_worker(self.module, self.dsn, log, *chaos, *args, env={"CHAOS_DSN": self.dsn})
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def stop_all(self) -> list[int | None]:
        codes = []
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=30))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(None)
        return codes


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(dsn, tmp_path)
    yield w
    for p in w.procs:
        if p.poll() is None:
            p.kill()
            p.wait()


async def count(conn, where: str) -> int:
    return await conn.fetchval(f"SELECT count(*) FROM pgworker.jobs WHERE {where}")


async def reconcile(conn, total: int) -> None:
    """Everything completed; nothing pending or running; every job that ran more than once has a
    recorded `lost` attempt to explain it; no attempt left open."""
    assert await count(conn, "status = 'completed'") == total
    assert await count(conn, "status IN ('pending', 'running')") == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts WHERE outcome = 'running'")
        == 0
    )
    unexplained = await conn.fetchval(
        """SELECT count(*) FROM pgworker.jobs j WHERE j.attempts > 1 AND NOT EXISTS (
               SELECT FROM pgworker.job_attempts a
               WHERE a.job_id = j.id AND a.outcome IN ('lost', 'interrupted', 'retried'))"""
    )
    assert unexplained == 0


async def test_sigkill_with_jobs_in_flight_is_finished_by_another_worker(dsn, conn, workers):
    total = 200
    await pgworker.enqueue_many(conn, [JobSpec("work", {"n": n, "ms": 50}) for n in range(total)])
    a = workers.start("a", "--lease", "1", "--concurrency", "10")
    await wait_for(lambda: count(conn, "status = 'completed'"), timeout=30)
    await wait_for(
        lambda: conn.fetchval("SELECT count(*) >= 5 FROM pgworker.jobs WHERE status = 'running'"),
        timeout=30,
    )
    a.kill()
    a.wait()
    in_flight = await count(conn, "status = 'running'")
    assert in_flight > 0
    workers.start("b", "--lease", "1", "--concurrency", "10")
    await wait_for(
        lambda: conn.fetchval(
            "SELECT count(*) = $1 FROM pgworker.jobs WHERE status = 'completed'", total
        ),
        timeout=60,
    )
    await reconcile(conn, total)
    lost = await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_attempts WHERE outcome = 'lost' AND worker_id = 'a'"
    )
    assert lost == in_flight
    assert workers.stop_all()[1] == 0


async def test_sigstop_past_the_lease_then_sigcont_completes_once(dsn, conn, workers):
    r = await pgworker.enqueue(conn, "work", {"n": 1, "ms": 2500})
    a = workers.start("a", "--lease", "1")
    await wait_for(
        lambda: conn.fetchval(
            "SELECT status = 'running' FROM pgworker.jobs WHERE id = $1", r.job.id
        ),
        timeout=30,
    )
    a.send_signal(signal.SIGSTOP)
    try:
        # b's lease outlasts the job by far: on a busy machine a 1 s lease may lapse between
        # two heartbeats, and b's attempt be rescued too (a third attempt, not the promise here)
        workers.start("b", "--lease", "10")
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", r.job.id
            ),
            timeout=60,
        )
    finally:
        a.send_signal(signal.SIGCONT)
    # Awake, the worker fences itself (its heartbeats went unanswered past the deadline) or, had
    # the handler ended first, its late outcome is refused.
    await wait_for(
        lambda: any(
            line in workers.log("a")
            for line in ("lost contact with the database", "outcome dropped")
        ),
        timeout=30,
    )
    assert workers.stop_all() == [0, 0]
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.worker_id, job.attempts) == ("completed", "b", 2)
    rows = await attempts(conn, r.job.id)
    assert [(x["worker_id"], x["outcome"]) for x in rows] == [("a", "lost"), ("b", "completed")]


async def test_effect_recorded_before_a_crash_happens_once(dsn, conn, workers):
    """A transactional step commits its effect with its checkpoint; the worker is SIGKILLed after
    it, before the acknowledgement, and the rescued job runs again: the runs table (one row per
    run) proves the second run happened, and the effects table, which has no unique key, shows
    the step did not write the effect again (it returned the first run's result)."""
    await conn.execute("CREATE TABLE chaos_effects (job_id bigint, attempt int)")
    await conn.execute("CREATE TABLE chaos_runs (job_id bigint, attempt int)")
    r = await pgworker.enqueue(conn, "step-effect", {}, idempotency_key="effect-1")
    a = workers.start("a", "--lease", "1")
    await wait_for(lambda: conn.fetchval("SELECT count(*) FROM chaos_effects"), timeout=30)
    a.kill()  # after the step committed, before the acknowledgement
    a.wait()
    workers.start("b", "--lease", "1")
    await wait_for(
        lambda: conn.fetchval(
            "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", r.job.id
        ),
        timeout=60,
    )
    runs = await conn.fetch("SELECT job_id, attempt FROM chaos_runs ORDER BY attempt")
    assert [tuple(x) for x in runs] == [(r.job.id, 1), (r.job.id, 2)]
    effects = await conn.fetch("SELECT job_id, attempt FROM chaos_effects")
    assert [tuple(x) for x in effects] == [(r.job.id, 1)]
    job = await pgworker.get_job(conn, r.job.id)
    assert job.result == {"effect_by_attempt": 1}
    rows = await attempts(conn, r.job.id)
    assert [x["outcome"] for x in rows] == ["lost", "completed"]
    assert workers.stop_all()[1] == 0


@pytest.fixture
def own_cluster() -> Iterator[devdb.Cluster]:
    """A PostgreSQL of this test's own, which it may terminate and restart."""
    data = tempfile.mkdtemp(prefix="pgw-chaos-")
    cluster = devdb.Cluster(data, bindir=devdb.local_bindir(), fsync=False)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


async def test_backends_terminated_then_postgres_restarted_mid_run(own_cluster, tmp_path):
    dsn = own_cluster.dsn
    conn = await asyncpg.connect(dsn)
    await pgworker.migrate(conn)
    total = 400
    await pgworker.enqueue_many(conn, [JobSpec("work", {"n": n, "ms": 20}) for n in range(total)])
    await conn.close()
    workers = Workers(dsn, tmp_path)
    try:
        procs = [workers.start(name, "--lease", "2", "--concurrency", "5") for name in "ab"]

        async def completed() -> int:
            c = await asyncpg.connect(dsn)
            try:
                return await count(c, "status = 'completed'")
            finally:
                await c.close()

        await wait_for(lambda: _at_least(completed, 50), timeout=60)

        async def connected() -> int:
            # Both workers up: on a busy machine one can finish 50 jobs before the other has
            # connected at all.
            c = await asyncpg.connect(dsn)
            try:
                return int(
                    await c.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE application_name LIKE 'pgworker%'"
                    )
                )
            finally:
                await c.close()

        await wait_for(lambda: _at_least(connected, 6), timeout=60)
        c = await asyncpg.connect(dsn)
        killed = await c.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE 'pgworker%'"
        )
        await c.close()
        assert killed >= 6  # 2 workers, each with its pool, listener and maintenance
        await wait_for(lambda: _at_least(completed, 150), timeout=60)
        own_cluster.stop("fast")
        own_cluster.start()
        await wait_for(lambda: _at_least(completed, total), timeout=120)
        assert [p.poll() for p in procs] == [None, None]  # no worker exited
        assert workers.stop_all() == [0, 0]
        c = await asyncpg.connect(dsn)
        try:
            await reconcile(c, total)
        finally:
            await c.close()
        logs = workers.log("a") + workers.log("b")
        assert "listener reconnected" in logs
    finally:
        for p in workers.procs:
            if p.poll() is None:
                p.kill()


async def _at_least(counter, n: int) -> bool:
    try:
        return await counter() >= n
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False


# --- PostgreSQL crashing mid-run -------------------------------------------------------------


async def test_postgres_crashing_mid_run_loses_no_job_and_stops_no_worker(own_cluster, tmp_path):
    """The soak's server crash, short: an immediate stop (claims that had not reached the disk
    are undone, their late outcomes fenced), then a restart."""
    dsn = own_cluster.dsn
    conn = await asyncpg.connect(dsn)
    await pgworker.migrate(conn)
    total = 300
    await pgworker.enqueue_many(
        conn, [JobSpec("work", {"n": n, "ms": 40, "claim": True}) for n in range(total)]
    )
    workers = Workers(dsn, tmp_path)
    try:
        procs = [workers.start(name, "--lease", "2", "--concurrency", "5") for name in "ab"]
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) >= 60 FROM pgworker.jobs WHERE status = 'completed'"
            ),
            timeout=30,
        )
        left = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        )
        assert left > 50  # the crash comes mid-run
        await conn.close()
        own_cluster.stop("immediate")
        own_cluster.start()
        conn = await asyncpg.connect(dsn)
        await wait_for(lambda: all_finished(conn), timeout=40)
        assert [p.poll() for p in procs] == [None, None]  # no worker exited
        assert workers.stop_all() == [0, 0]
        await reconcile(conn, total)
        completed_twice = await conn.fetchval(
            """SELECT count(*) FROM (SELECT job_id FROM pgworker.job_attempts
                   WHERE outcome = 'completed' GROUP BY job_id HAVING count(*) > 1) AS d"""
        )
        assert completed_twice == 0
        # A late outcome of a claim the crash undid must not complete the job's next claim.
        not_by_its_claim = await conn.fetchval(
            """SELECT count(*) FROM pgworker.jobs
               WHERE (result->>'claimed_at')::timestamptz IS DISTINCT FROM claimed_at"""
        )
        assert not_by_its_claim == 0
        assert "listener reconnected" in workers.log("a") + workers.log("b")
    finally:
        for p in workers.procs:
            if p.poll() is None:
                p.kill()
        await conn.close()
