"""A worker cut off from the database fences itself. Through a proxy that stops
forwarding anything (a database that no longer answers, every socket open: what a silently
dropped network looks like), the worker stops its attempt before the lease it holds can expire,
says so once, writes nothing; another worker rescues the job and runs it; once the proxy
forwards again, the fenced worker serves new jobs, and its attempt stays as the rescue recorded
it."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker import RetryPolicy

from .helpers import PgProxy, attempts, has_status, logged, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE = 9.0
"""The cut-off worker's lease: it stops its attempts 1.5 s before the lease can expire."""
FAST = RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.2, jitter=0.1)
FENCED = "lost contact with the database"
BACK = "the database answers again"


def cut_off_registry(kind: str, started: list[float], stopped: list[float]) -> pgworker.Registry:
    """Type "t": a quick job returns at once; any other runs until the worker stops it, and
    records when it learnt so (an `async def` handler by its cancellation, a plain `def` one by
    `ctx.stopped`)."""
    registry = pgworker.Registry()
    if kind == "async":

        @registry.task("t", retry=FAST)
        async def handle(ctx: Any, payload: Any) -> Any:
            if payload.get("quick"):
                return "cut-off"
            started.append(time.time())
            try:
                await anyio.sleep(3600)
            except anyio.get_cancelled_exc_class():
                stopped.append(time.time())
                raise

    else:

        @registry.task("t", retry=FAST)
        def handle_in_a_thread(ctx: Any, payload: Any) -> Any:
            if payload.get("quick"):
                return "cut-off"
            started.append(time.time())
            give_up = time.monotonic() + 120
            while not ctx.stopped and time.monotonic() < give_up:
                time.sleep(0.01)
            stopped.append(time.time())
            return "ran to the end"

    return registry


@pytest.mark.parametrize("kind", ["async", "def"])
async def test_a_cut_off_worker_stops_its_attempt_before_its_lease_expires(
    dsn: str, conn: Any, kind: str
) -> None:
    started: list[float] = []
    stopped: list[float] = []
    rescuer = pgworker.Registry()

    @rescuer.task("t", retry=FAST)
    async def rescue(ctx: Any, payload: Any) -> Any:
        return "rescuer"

    job = (await pgworker.enqueue(conn, "t", {})).job.id
    async with PgProxy(dsn) as proxy:
        with capture_logs() as logs:
            async with pgworker.Worker(
                cut_off_registry(kind, started, stopped),
                proxy.dsn,
                worker_id="cut-off",
                lease=LEASE,
                poll_interval=0.1,
                shutdown_timeout=5.0,
            ):
                await wait_for(lambda: started, timeout=30)
                proxy.stall()
                await wait_for(lambda: stopped, timeout=30)
                # Nothing the cut-off worker did reached the database: the job is still its
                # attempt's, its lease as the last heartbeat left it.
                row = await conn.fetchrow(
                    "SELECT status, attempts, worker_id, lease_expires_at "
                    "FROM pgworker.jobs WHERE id = $1",
                    job,
                )
                assert (row["status"], row["attempts"], row["worker_id"]) == (
                    "running",
                    1,
                    "cut-off",
                )
                assert stopped[0] < row["lease_expires_at"].timestamp(), (
                    f"stopped {stopped[0] - row['lease_expires_at'].timestamp():.2f}s after "
                    "its lease expired"
                )
                [fenced] = logged(logs, FENCED)
                assert fenced["attempts"] == 1 and fenced["log_level"] == "warning"
                assert [a["outcome"] for a in await attempts(conn, job)] == ["running"]

                async with pgworker.Worker(
                    rescuer, dsn, worker_id="rescuer", lease=2.0, poll_interval=0.1
                ):
                    await wait_for(lambda: has_status(conn, job, "completed"), timeout=60)
                first, second = await attempts(conn, job)
                assert (first["worker_id"], first["outcome"], first["error_type"]) == (
                    "cut-off",
                    "lost",
                    "WorkerLost",
                )
                assert (second["worker_id"], second["outcome"]) == ("rescuer", "completed")
                assert stopped[0] < first["finished_at"].timestamp()
                assert stopped[0] < second["started_at"].timestamp()

                # The database answers again: the same worker, never restarted, serves again.
                proxy.resume()
                await wait_for(lambda: logged(logs, BACK), timeout=60)
                quick = (await pgworker.enqueue(conn, "t", {"quick": True})).job.id
                await wait_for(lambda: has_status(conn, quick, "completed"), timeout=30)
                done = await pgworker.get_job(conn, quick)
                assert (done.worker_id, done.result, done.attempts) == ("cut-off", "cut-off", 1)
    assert len(logged(logs, FENCED)) == 1
    assert not logged(logs, "outcome dropped")
    assert not logged(logs, "job completed", job_id=job, worker_id="cut-off")
    assert logged(logs, "job lost", job_id=job, worker_id="cut-off")
    [stopped_line] = logged(logs, "worker stopped", worker_id="cut-off")
    assert stopped_line["outcomes_dropped"] == 0
    rescued = await pgworker.get_job(conn, job)
    assert (rescued.status, rescued.result, rescued.retry_count) == ("completed", "rescuer", 1)
    assert [tuple(a) for a in await attempts(conn, job)] == [tuple(first), tuple(second)]


async def test_a_heartbeat_never_answered_is_given_up_and_sent_again_on_a_new_connection(
    dsn: str,
) -> None:
    """On a network that drops packets silently, a statement sent is never answered, even once
    the network heals: each heartbeat is bounded (a third of the lease) and its connection
    closed, so that the first heartbeat on a new connection lets the worker serve again."""
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: Any, payload: Any) -> None:
        pass

    async with PgProxy(dsn) as proxy:
        with capture_logs() as logs:
            async with pgworker.Worker(
                registry, proxy.dsn, worker_id="cut-off", lease=6.0, listen=False
            ):
                proxy.stall()
                await wait_for(lambda: logged(logs, "heartbeat failed"), timeout=30)
                [fenced] = await wait_for(lambda: logged(logs, FENCED), timeout=30)
                assert fenced["attempts"] == 0
                for link in proxy.links:  # what was sent before is never answered
                    link.pause()
                proxy.resume()
                await wait_for(lambda: logged(logs, BACK), timeout=60)
    [failed, *_] = logged(logs, "heartbeat failed; retrying")
    assert failed["error"] == "TimeoutError: the database did not answer within 2s", failed


SLEEPING = """
SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'pgworker%'
  AND wait_event = 'PgSleep'
"""


async def test_a_heartbeat_given_up_is_cancelled_on_the_server_too(dsn: str, conn: Any) -> None:
    """A heartbeat past its bound is abandoned, and its statement cancelled on the server: the
    closed connection alone let it run on for as long as it took, with its row locks and its
    snapshot (a given-up heartbeat held the rows its outcome writes then waited for)."""
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: Any, payload: Any) -> None:
        pass

    await conn.execute(
        "CREATE FUNCTION public.slow_beat() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$"
    )
    async with pgworker.Worker(registry, dsn, worker_id="slow-beat", lease=3.0, listen=False):
        await wait_for(lambda: conn.fetchval("SELECT count(*) FROM pgworker.workers"))
        await conn.execute(
            "CREATE TRIGGER slow_beat BEFORE UPDATE ON pgworker.workers "
            "FOR EACH ROW EXECUTE FUNCTION public.slow_beat()"
        )
        try:
            [first, *_] = await wait_for(lambda: conn.fetchval(SLEEPING), timeout=15)

            async def ended() -> bool:
                return first not in await conn.fetchval(SLEEPING)

            # Given up after a third of the lease (1 s); its sleep had 59 s left.
            await wait_for(ended, timeout=10)
        finally:
            await conn.execute("DROP TRIGGER slow_beat ON pgworker.workers")
