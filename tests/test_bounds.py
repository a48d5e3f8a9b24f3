"""Bounded work beyond the HTTP API: the dashboard's pages and buttons are bounded as the API's
requests are (503 page with Retry-After, a button given up never applied later), a replay given
up is never logged as done, and serve's maintenance gives up a lock it waits on and goes on.
Also: enqueued_jobs(payload=None) finds a job enqueued with None, and enqueue_many works in a
transaction begun with a raw BEGIN."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import pgworker
from pgworker import JobSpec
from pgworker.testing import assert_enqueued, enqueued_jobs

from .helpers import PgProxy, status_of, wait_for
from .test_dashboard import csrf_of, http
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

BOUND = 10.0
"""The README's promise: every request of `serve` is answered within 10 s."""


async def serve_idle(conn: Any) -> bool:
    """No statement of `serve` is running (one waiting on a lock would be)."""
    busy = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgworker:serve%' "
        "AND state <> 'idle' AND pid <> pg_backend_pid() AND datname = current_database()"
    )
    return busy == 0


async def timed(c: httpx.AsyncClient, method: str, path: str, **kw: Any) -> tuple[Any, float]:
    start = time.monotonic()
    try:
        r: Any = await c.request(method, path, **kw)
    except httpx.TimeoutException as exc:
        r = exc
    return r, time.monotonic() - start


def assert_error_page(r: Any, took: float) -> None:
    assert isinstance(r, httpx.Response), f"no answer within 30 s ({r!r})"
    assert r.status_code == 503, r.text[:500]
    assert int(r.headers["Retry-After"]) >= 1
    assert r.headers["content-type"].startswith("text/html"), r.headers
    assert "<html" in r.text.lower() and "Traceback" not in r.text
    assert took < BOUND, f"answered after {took:.1f}s"


async def job_row(conn: Any, job_id: int) -> tuple[Any, ...]:
    row = await conn.fetchrow(
        "SELECT status, cancel_requested_at, attempts, retry_count, run_at "
        "FROM pgworker.jobs WHERE id = $1",
        job_id,
    )
    events = await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_events WHERE job_id = $1", job_id
    )
    return (*row, events)


# --- the dashboard --------------------------------------------------------------------------------


async def test_a_dashboard_button_on_a_locked_job_is_503_in_time_and_never_applied(
    dsn: str, conn: Any
) -> None:
    """The dashboard sent its statements on the pool with no bound: Replay and Cancel on a job
    whose row another session held locked hung, and were applied once the lock was released."""
    failed = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', attempts = 1, error = 'E: no' WHERE id = $1",
        failed,
    )
    pending = (await pgworker.enqueue(conn, "t", {})).job.id
    before = {i: await job_row(conn, i) for i in (failed, pending)}
    async with serving(dsn) as served, http(served) as client:
        tokens = {i: csrf_of((await client.get(f"/ui/jobs/{i}")).text) for i in (failed, pending)}
        locker = await asyncpg.connect(dsn)
        try:
            tx = locker.transaction()
            await tx.start()
            await locker.execute(
                "SELECT 1 FROM pgworker.jobs WHERE id = ANY($1::bigint[]) FOR UPDATE",
                [failed, pending],
            )
            answers: dict[str, tuple[Any, float]] = {}

            async def press(action: str, job_id: int) -> None:
                answers[action] = await timed(
                    client, "POST", f"/ui/jobs/{job_id}/{action}", data={"csrf": tokens[job_id]}
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(press, "replay", failed)
                tg.start_soon(press, "cancel", pending)
            await tx.rollback()
        finally:
            await locker.close()
        for action in ("replay", "cancel"):
            r, took = answers[action]
            assert_error_page(r, took)
            assert "locked by another session" in r.text, r.text
        await wait_for(lambda: serve_idle(conn), timeout=30)
        assert {i: await job_row(conn, i) for i in (failed, pending)} == before
        # Nothing in the way now: the same buttons do what they say.
        for action, job_id in (("replay", failed), ("cancel", pending)):
            token = csrf_of((await client.get(f"/ui/jobs/{job_id}")).text)
            r = await client.post(f"/ui/jobs/{job_id}/{action}", data={"csrf": token})
            assert r.status_code == 303, r.text
        assert await status_of(conn, failed) == "pending"
        assert await status_of(conn, pending) == "cancelled"
        assert "Traceback" not in served.stderr()


async def test_a_dashboard_page_on_a_stalled_database_is_503_in_time(dsn: str, conn: Any) -> None:
    """With the database stalled, the dashboard's pages hung as long as the database did."""
    job = (await pgworker.enqueue(conn, "t", {})).job.id
    async with PgProxy(dsn) as proxy, serving(proxy.dsn) as served, http(served) as client:
        pages = ["/", "/ui/jobs", f"/ui/jobs/{job}", "/ui/workers"]
        for page in pages:
            assert (await client.get(page)).status_code == 200, page
        token = csrf_of((await client.get(f"/ui/jobs/{job}")).text)
        proxy.stall()
        answers: dict[str, tuple[Any, float]] = {}

        async def send(name: str, method: str, path: str, form: Any = None) -> None:
            answers[name] = await timed(client, method, path, data=form)

        async with anyio.create_task_group() as tg:
            for page in pages:
                tg.start_soon(send, page, "GET", page)
            tg.start_soon(send, "cancel", "POST", f"/ui/jobs/{job}/cancel", {"csrf": token})
        for r, took in answers.values():
            assert_error_page(r, took)
        proxy.resume()

        async def shown() -> bool:
            return (await client.get("/ui/jobs")).status_code == 200

        await wait_for(shown, timeout=30)
        await wait_for(lambda: serve_idle(conn), timeout=30)
        assert await status_of(conn, job) == "pending"
        assert "Traceback" not in served.stderr()


# --- a replay given up is not logged ------------------------------------------------------------


GATE = 20_2026
"""The advisory lock a deferred trigger on job_events waits for at COMMIT, while the test holds
it. (A trigger that only runs long would not do: PostgreSQL stops a statement's statement_timeout
before it commits, so a COMMIT is bounded by lock_timeout and serve's overall 8 s alone.)"""

SLOW_COMMIT = f"""
CREATE FUNCTION pgworker.test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_advisory_xact_lock({GATE}); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER test_slow_commit AFTER INSERT ON pgworker.job_events
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgworker.test_slow_commit();
"""


async def test_a_replay_given_up_at_commit_is_neither_applied_nor_logged(
    dsn: str, conn: Any
) -> None:
    """POST /jobs/{id}/replay (and the dashboard's Replay) logged "job replayed" inside the
    request's transaction: a request then given up (here at its COMMIT, whose deferred trigger
    waits on a lock another session holds) logged a replay that never happened."""
    failed = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', attempts = 1, error = 'E: no' WHERE id = $1",
        failed,
    )
    before = await job_row(conn, failed)
    await conn.execute(SLOW_COMMIT)
    await conn.execute("SELECT pg_advisory_lock($1)", GATE)
    async with serving(dsn) as served:
        async with served.client(timeout=30) as c:
            r, took = await timed(c, "POST", f"/jobs/{failed}/replay")
            assert isinstance(r, httpx.Response) and r.status_code == 503, r
            assert "locked by another session" in r.json()["error"] and took < BOUND, r.text
        async with http(served) as client:
            token = csrf_of((await client.get(f"/ui/jobs/{failed}")).text)
            r, took = await timed(client, "POST", f"/ui/jobs/{failed}/replay", data={"csrf": token})
            assert_error_page(r, took)
        await conn.execute("SELECT pg_advisory_unlock($1)", GATE)
        await wait_for(lambda: serve_idle(conn), timeout=30)
        assert await job_row(conn, failed) == before
        assert "job replayed" not in served.stderr()

        # The same replay, its COMMIT unhindered: applied, and logged once.
        async with served.client(timeout=30) as c:
            r = await c.post(f"/jobs/{failed}/replay")
            assert r.status_code == 200, r.text

        async def logged() -> bool:
            return "job replayed" in served.stderr()

        await wait_for(logged, timeout=10)
        assert served.stderr().count("job replayed") == 1
    assert await status_of(conn, failed) == "pending"


HELD_COMMIT = f"""
CREATE FUNCTION pgworker.test_held_commit() RETURNS trigger LANGUAGE plpgsql SET lock_timeout = 0
AS $$ BEGIN PERFORM pg_advisory_xact_lock({GATE}); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER test_held_commit AFTER INSERT ON pgworker.job_events
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgworker.test_held_commit();
"""
"""A deferred trigger that holds a COMMIT until the test opens GATE, whatever the request's
lock_timeout (the function's own is 0); statement_timeout does not bound a COMMIT."""


async def test_a_commit_held_past_the_bound_is_answered_503_and_never_applied(
    dsn: str, conn: Any
) -> None:
    """A COMMIT held by a deferred trigger past the 8 s bound: serve answered 503 and closed its
    side of the connection, and the backend went on; once the trigger finished, the replay was
    committed, long after its 503. Now the backend notices the closed connection
    (client_connection_check_interval) and rolls the request back."""
    failed = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', attempts = 1, error = 'E: no' WHERE id = $1",
        failed,
    )
    before = await job_row(conn, failed)
    await conn.execute(HELD_COMMIT)
    await conn.execute("SELECT pg_advisory_lock($1)", GATE)
    try:
        async with serving(dsn) as served, served.client(timeout=30) as c:
            r, took = await timed(c, "POST", f"/jobs/{failed}/replay")
            assert isinstance(r, httpx.Response) and r.status_code == 503, r
            assert "may or may not have been applied" in r.json()["error"], r.text
            assert took < BOUND, f"answered after {took:.1f}s"
            # The trigger finishes once the gate opens: opened once serve's backend is gone,
            # or after 15 s, for a backend that never goes.
            with contextlib.suppress(AssertionError):
                await wait_for(lambda: serve_idle(conn), timeout=15)
            await conn.execute("SELECT pg_advisory_unlock($1)", GATE)
            await wait_for(lambda: serve_idle(conn), timeout=30)
            assert await job_row(conn, failed) == before, "applied after its 503"
            assert "job replayed" not in served.stderr()
    finally:
        await conn.execute("SELECT pg_advisory_unlock_all()")


# --- serve's maintenance -------------------------------------------------------------------------


async def test_serve_maintenance_gives_up_a_locked_row_and_goes_on(dsn: str, conn: Any) -> None:
    """serve's maintenance ran on a pool without lock_timeout: with the leader row locked by
    another session, its renewal waited as long as the lock was held, saying nothing."""
    async with serving(dsn, env={"PGWORKER_LEASE": "3"}) as served:

        async def leading() -> bool:
            found = await conn.fetchval(
                "SELECT worker_id FROM pgworker.leader WHERE expires_at > now()"
            )
            return bool(found and found.startswith("serve-"))

        await wait_for(leading, timeout=30)
        async with conn.transaction():
            await conn.execute("SELECT * FROM pgworker.leader FOR UPDATE")

            async def retrying() -> bool:
                return "maintenance failed; retrying" in served.stderr()

            # lock_timeout is a third of the lease (1 s): it fails on its next tick, and says so.
            await wait_for(retrying, timeout=30)
            assert "lock" in served.stderr().split("maintenance failed; retrying", 1)[1][:500]
            held = await conn.fetchval("SELECT expires_at FROM pgworker.leader")
        # Released: the service goes on, and renews its leadership.

        async def renewed() -> bool:
            return bool(await conn.fetchval("SELECT expires_at > $1 FROM pgworker.leader", held))

        await wait_for(renewed, timeout=30)
        await wait_for(lambda: serve_idle(conn), timeout=30)
        assert "Traceback" not in served.stderr()


# --- pgworker.testing and enqueue_many -----------------------------------------------------------


async def test_enqueued_jobs_payload_none_finds_a_job_enqueued_with_none(conn: Any) -> None:
    """A None payload is stored {} on every path since migration 10; enqueued_jobs(payload=None)
    looked for a stored JSON null, and so never found a job enqueued with None."""
    made = (await pgworker.enqueue(conn, "t", None)).job.id
    await pgworker.enqueue(conn, "t", {"a": 1})
    assert [j.id for j in await enqueued_jobs(conn, "t", payload=None)] == [made]
    assert (await assert_enqueued(conn, "t", payload=None, count=1)).id == made
    assert len(await enqueued_jobs(conn, "t")) == 2  # no payload given: any payload


async def test_enqueue_many_in_a_transaction_begun_with_a_raw_begin(dsn: str, conn: Any) -> None:
    """asyncpg refuses to nest its transaction in one begun with `execute("BEGIN")`: enqueue_many
    raised its InterfaceError. The batch is still all or nothing (a savepoint), and its rows are
    kept only when the caller's transaction commits."""
    await pgworker.enqueue(conn, "t", {"a": 1}, idempotency_key="old")
    other = await asyncpg.connect(dsn)
    try:
        await other.execute("BEGIN")
        with pytest.raises(pgworker.IdempotencyConflict):
            await pgworker.enqueue_many(
                other,
                [
                    JobSpec("t", {"n": 1}, idempotency_key="new"),
                    JobSpec("t", {"a": 2}, idempotency_key="old"),
                ],
            )
        plain = await pgworker.enqueue_many(other, [JobSpec("u", {"n": n}) for n in range(3)])
        keyed = await pgworker.enqueue_many(other, [JobSpec("k", {}, idempotency_key="k1")])
        assert other.is_in_transaction()
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type <> 't'") == 0
        await other.execute("COMMIT")
    finally:
        await other.close()
    assert sorted(j.id for j in await enqueued_jobs(conn, "u")) == sorted(r.job.id for r in plain)
    assert [j.id for j in await enqueued_jobs(conn, "k")] == [keyed[0].job.id]
    assert await enqueued_jobs(conn, idempotency_key="new") == []
