"""Durable waits for an event, with real workers: a waiting job holds no
attempt and no slot, `emit` (from SQL too) resumes it with the data, the steps before the wait
are not repeated, a timeout raises TimeoutError inside the handler, an event emitted before the
wait is consumed at once, an emit between the wait's record and the attempt's outcome is not
lost, and bad input writes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import ValidationError

from .helpers import has_status, serving_guarded, wait_for
from .webserver import Served, server

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name


async def outcomes(conn: Any, job_id: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt", job_id
    )
    return [r["outcome"] for r in rows]


async def result_of(conn: Any, job_id: int) -> Any:
    job = await pgworker.get_job(conn, job_id)
    assert job is not None
    return job.result


async def parked(conn: Any, job_id: int) -> bool:
    """The job is pending, its last attempt ended `waiting`, none runs."""
    row = await conn.fetchrow(
        "SELECT j.status, j.run_at = 'infinity' AS forever, "
        "(SELECT count(*) FROM pgworker.job_attempts a WHERE a.job_id = j.id "
        " AND a.outcome = 'running') AS running, "
        "(SELECT outcome FROM pgworker.job_attempts a WHERE a.job_id = j.id "
        " ORDER BY attempt DESC LIMIT 1) AS last "
        "FROM pgworker.jobs j WHERE j.id = $1",
        job_id,
    )
    return row["status"] == "pending" and row["running"] == 0 and row["last"] == "waiting"


def approval_registry(calls: list[str]) -> pgworker.Registry:
    registry = pgworker.Registry()

    def send(job_id: int) -> str:
        calls.append("send")
        return f"request {job_id} sent"

    @registry.task("approve")
    async def approve(ctx: pgworker.JobContext, payload: dict[str, Any]) -> Any:
        sent = await ctx.step("send", send, ctx.job_id)
        try:
            decision = await ctx.wait_for_event(f"approval:{payload['id']}")
        except Exception:  # the wait's end of the attempt is not an Exception
            return "swallowed"
        return {"sent": sent, "decision": decision}

    @registry.task("quick")
    async def quick(ctx: pgworker.JobContext, payload: dict[str, Any]) -> str:
        return "done"

    return registry


async def test_a_waiting_job_holds_no_attempt_nor_slot_and_emit_from_sql_resumes_it(dsn, conn):
    calls: list[str] = []
    r = await pgworker.enqueue(conn, "approve", {"id": 7})
    async with serving_guarded(approval_registry(calls), dsn, concurrency=1):
        await wait_for(lambda: parked(conn, r.job.id))
        assert await conn.fetchval(
            "SELECT run_at = 'infinity' FROM pgworker.jobs WHERE id = $1", r.job.id
        )
        # Its one slot is free: another job runs meanwhile.
        other = await pgworker.enqueue(conn, "quick", {})
        await wait_for(lambda: has_status(conn, other.job.id, "completed"))
        assert await parked(conn, r.job.id)
        woken = await conn.fetchval(
            'SELECT pgworker.emit(\'approval:7\', \'{"ok": true, "by": "ann"}\')'
        )
        assert woken == 1
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert await result_of(conn, r.job.id) == {
        "sent": f"request {r.job.id} sent",
        "decision": {"ok": True, "by": "ann"},
    }
    assert calls == ["send"]  # the step before the wait ran once
    assert await outcomes(conn, r.job.id) == ["waiting", "completed"]
    row = await conn.fetchrow(
        "SELECT retry_count, error FROM pgworker.jobs WHERE id = $1", r.job.id
    )
    assert (row["retry_count"], row["error"]) == (0, None)


async def test_a_timeout_raises_timeout_error_inside_the_handler(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("patient")
    async def patient(ctx: pgworker.JobContext, payload: dict[str, Any]) -> str:
        try:
            await ctx.wait_for_event("never", timeout=0.3)
        except TimeoutError:
            return "timed out"
        return "came"

    r = await pgworker.enqueue(conn, "patient", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert await result_of(conn, r.job.id) == "timed out"
    assert await outcomes(conn, r.job.id) == ["waiting", "completed"]
    assert await conn.fetchval(
        "SELECT timed_out FROM pgworker.job_event_waits WHERE job_id = $1", r.job.id
    )


async def test_an_event_emitted_before_the_wait_is_consumed_at_once_once_per_job(dsn, conn):
    calls: list[str] = []
    first = await pgworker.enqueue(conn, "approve", {"id": 1}, delay=0.2)
    second = await pgworker.enqueue(conn, "approve", {"id": 1}, delay=0.2)
    assert await pgworker.emit(conn, "approval:1", {"ok": 1}) == 0  # nobody waits yet
    async with serving_guarded(approval_registry(calls), dsn):
        for r in (first, second):
            await wait_for(lambda r=r: has_status(conn, r.job.id, "completed"))
        # One event, kept: each job consumed it, at once (no waiting attempt).
        for r in (first, second):
            assert (await result_of(conn, r.job.id))["decision"] == {"ok": 1}
            assert await outcomes(conn, r.job.id) == ["completed"]
        # A job consumes an event once: its second wait for the name waits for another one.
        later = await pgworker.enqueue(conn, "approve", {"id": 2})
        await wait_for(lambda: parked(conn, later.job.id))
        assert await pgworker.emit(conn, "approval:2", "yes") == 1
        await wait_for(lambda: has_status(conn, later.job.id, "completed"))
    assert (await result_of(conn, later.job.id))["decision"] == "yes"


async def test_an_event_emitted_before_the_job_was_enqueued_is_not_consumed(dsn, conn):
    calls: list[str] = []
    await pgworker.emit(conn, "approval:3", "old")
    r = await pgworker.enqueue(conn, "approve", {"id": 3})
    async with serving_guarded(approval_registry(calls), dsn):
        await wait_for(lambda: parked(conn, r.job.id))
        await pgworker.emit(conn, "approval:3", "new")
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert (await result_of(conn, r.job.id))["decision"] == "new"


async def test_an_emit_between_the_wait_and_the_outcome_is_not_lost(dsn, conn):
    """The handler sees its attempt end (re-raising it) and emits from another connection, which
    commits before the attempt's outcome is written: the outcome must not park the job."""
    registry = pgworker.Registry()

    @registry.task("racy")
    async def racy(ctx: pgworker.JobContext, payload: dict[str, Any]) -> Any:
        try:
            return await ctx.wait_for_event("race")
        except BaseException:
            if ctx.attempt == 1:
                other = await asyncpg.connect(dsn)
                try:
                    assert await other.fetchval("SELECT pgworker.emit('race', '42')") == 1
                finally:
                    await other.close()
            raise

    r = await pgworker.enqueue(conn, "racy", {})
    async with serving_guarded(registry, dsn, poll_interval=30.0):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert await result_of(conn, r.job.id) == 42
    assert await outcomes(conn, r.job.id) == ["waiting", "completed"]


async def test_an_emit_in_a_transaction_open_while_the_wait_is_recorded_is_not_lost(dsn, conn):
    """The emit's transaction holds the name's lock: the wait's record waits for its commit and
    then reads the event (neither reads before the other wrote)."""
    calls: list[str] = []
    r = await pgworker.enqueue(conn, "approve", {"id": 9}, delay=0.3)
    async with serving_guarded(approval_registry(calls), dsn):
        async with conn.transaction():
            assert await pgworker.emit(conn, "approval:9", "late") == 0
            # The job's attempt reaches its wait and blocks on the emit's lock.
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
                    "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                )
            )
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert (await result_of(conn, r.job.id))["decision"] == "late"
    assert await outcomes(conn, r.job.id) == ["completed"]


async def test_bad_input_is_refused_naming_the_field_and_writes_nothing(dsn, conn):
    for name in ("", "x" * 201, "a\x00b", None, 7):
        with pytest.raises(ValidationError) as caught:
            await pgworker.emit(conn, name, {"a": 1})
        assert caught.value.field == "name"
    for data in ({1, 2}, float("nan"), object()):
        with pytest.raises(ValidationError) as caught:
            await pgworker.emit(conn, "ok", data)
        assert caught.value.field == "data"
    for name in ("", "x" * 201):
        with pytest.raises(asyncpg.exceptions.InvalidParameterValueError, match=r"^name: "):
            await conn.fetchval("SELECT pgworker.emit($1)", name)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.events") == 0

    registry = pgworker.Registry()
    kept: list[pgworker.JobContext] = []

    @registry.task("bad")
    async def bad(ctx: pgworker.JobContext, payload: dict[str, Any]) -> list[str]:
        kept.append(ctx)
        refused = []
        for name, timeout in (("", None), ("x" * 201, None), ("n", -1), ("n", "soon")):
            try:
                await ctx.wait_for_event(name, timeout=timeout)
            except ValidationError as exc:
                refused.append(exc.field)
        return refused

    r = await pgworker.enqueue(conn, "bad", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    assert await result_of(conn, r.job.id) == ["name", "name", "timeout", "timeout"]
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_event_waits") == 0
    # Outside its attempt (the job ended), a wait is refused and records nothing.
    with pytest.raises(pgworker.PgWorkerError, match="no longer holds the job"):
        await kept[0].wait_for_event("late")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_event_waits") == 0


async def test_post_events_wakes_the_waiting_job_and_refuses_a_bad_name(
    server: Served, dsn: str, conn: Any
) -> None:
    calls: list[str] = []
    r = await pgworker.enqueue(conn, "approve", {"id": 5})
    async with serving_guarded(approval_registry(calls), dsn), server.client() as c:
        await wait_for(lambda: parked(conn, r.job.id))
        answer = await c.post("/events/approval%3A5", json={"ok": True})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"name": "approval:5", "woken": 1}
        await wait_for(lambda: has_status(conn, r.job.id, "completed"))
        too_long = await c.post("/events/" + "x" * 201, json=None)
        assert too_long.status_code == 422, too_long.text
        assert "name" in too_long.text
    assert (await result_of(conn, r.job.id))["decision"] == {"ok": True}
    assert await conn.fetchval("SELECT count(*) FROM pgworker.events") == 1


async def test_the_approval_recipe(dsn, conn):
    """docs/guide/events.md's recipe: the job asks once, waits, the endpoint's emit resumes it."""
    import httpx

    from examples.recipes import approval

    approval.sent.clear()
    r = await pgworker.enqueue(conn, "pay-expense", {"expense_id": 12})
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        transport = httpx.ASGITransport(app=approval.approvals(pool))
        async with (
            serving_guarded(approval.registry, dsn, concurrency=1),
            httpx.AsyncClient(transport=transport, base_url="http://app") as client,
        ):
            await wait_for(lambda: parked(conn, r.job.id))
            answer = await client.post(
                "/expenses/12/decision", params={"approved": "true", "by": "ann"}
            )
            assert answer.json() == {"woken": 1}
            await wait_for(lambda: has_status(conn, r.job.id, "completed"))
    finally:
        await pool.close()
    assert await result_of(conn, r.job.id) == {"paid": True, "approved_by": "ann"}
    assert approval.sent == [12]  # asked once
    assert await outcomes(conn, r.job.id) == ["waiting", "completed"]


async def test_show_and_the_dashboard_say_what_a_job_waits_for(dsn, conn):
    from pgworker.cli import _render

    calls: list[str] = []
    r = await pgworker.enqueue(conn, "approve", {"id": 4})
    async with serving_guarded(approval_registry(calls), dsn):
        await wait_for(lambda: parked(conn, r.job.id))
    found = await pgworker.operations.show_job(conn, r.job.id)
    assert found is not None
    text = _render.show_text(found)
    assert "waits for event approval:4" in text
    # A parked job's run_at ('infinity') is an aware time like every other.
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and job.run_at == pgworker.models.PARKED
    assert "run_at" in text and "infinity (parked" in text
    assert "until" not in text.split("waits for event approval:4")[1].splitlines()[0]
    assert '"name": "approval:4"' in _render.show_json(found)
    # With a deadline, it is said.
    registry = pgworker.Registry()

    @registry.task("timed")
    async def timed(ctx: pgworker.JobContext, payload: dict[str, Any]) -> Any:
        return await ctx.wait_for_event("later", timeout=3600)

    t = await pgworker.enqueue(conn, "timed", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: parked(conn, t.job.id))
    found = await pgworker.operations.show_job(conn, t.job.id)
    assert found is not None
    deadline = found["waits"][0]["deadline"]
    assert f"waits for event later (until {deadline.isoformat()})" in _render.show_text(found)


async def test_the_emit_command_wakes_the_waiting_job_and_refuses_bad_input(dsn, conn):
    from .helpers import cli

    calls: list[str] = []
    job = await pgworker.enqueue(conn, "approve", {"id": 9})
    async with serving_guarded(approval_registry(calls), dsn):
        await wait_for(lambda: parked(conn, job.job.id))
        done = cli("emit", "approval:9", "--data", '{"ok": true}', "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"name": "approval:9", "woken": 1}
        await wait_for(lambda: has_status(conn, job.job.id, "completed"))
    assert (await result_of(conn, job.job.id))["decision"] == {"ok": True}
    for args, word in ((["approval:9", "--data", "{nope"], "--data"), (["x" * 201], "name")):
        refused = cli("emit", *args, "--dsn", dsn)
        assert refused.returncode == 2 and word in refused.stderr, refused.stderr
    assert await conn.fetchval("SELECT count(*) FROM pgworker.events") == 1


async def test_a_plain_def_handler_waits_for_an_event_and_gets_its_data(dsn, conn):
    registry = pgworker.Registry()
    sent: list[int] = []

    @registry.task("approve-sync")
    def approve(ctx: pgworker.JobContext, payload: dict[str, Any]) -> Any:
        ctx.step("send", sent.append, ctx.job_id)
        return {"decision": ctx.wait_for_event(f"approval:{payload['id']}")}

    job = await pgworker.enqueue(conn, "approve-sync", {"id": 5})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: parked(conn, job.job.id))
        assert await pgworker.emit(conn, "approval:5", {"ok": "sync"}) == 1
        await wait_for(lambda: has_status(conn, job.job.id, "completed"))
    assert await result_of(conn, job.job.id) == {"decision": {"ok": "sync"}}
    assert await outcomes(conn, job.job.id) == ["waiting", "completed"]
    assert sent == [job.job.id]


# --- an event emitted before its wait --------------------------------------------------------


async def test_an_event_emitted_after_the_enqueue_reaches_the_wait(conn, dsn) -> None:
    """An emit whose statement runs after the job was enqueued, in a transaction begun before,
    is an event emitted after the enqueue: the wait recorded after its commit consumes it."""
    registry = pgworker.Registry()
    seen: list[object] = []

    @registry.task("approval")
    async def approval(ctx, payload):
        seen.append(await ctx.wait_for_event("approved", timeout=30))

    emitter = await asyncpg.connect(dsn)
    try:
        async with emitter.transaction():
            await emitter.execute("SELECT 1")  # the transaction's now() is taken here
            await asyncio.sleep(0.05)
            job = await pgworker.enqueue(conn, "approval", {})
            await asyncio.sleep(0.05)
            await pgworker.emit(emitter, "approved", {"ok": True})
        async with serving_guarded(registry, dsn):
            await wait_for(lambda: has_status(conn, job.job.id, "completed"), timeout=10)
    finally:
        await emitter.close()
    assert seen == [{"ok": True}]
