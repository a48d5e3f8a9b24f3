"""Enqueue against a real PostgreSQL: idempotency, transactions, validation, batches."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from functools import partial

import asyncpg
import pytest

import pgworker
from pgworker import JobSpec, ValidationError

from .webserver import Served, server

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name


async def count_jobs(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


async def test_enqueue_writes_a_pending_job_with_defaults(conn):
    r = await pgworker.enqueue(conn, "send-invoice", {"invoice_id": 42})
    assert r.created is True
    job = r.job
    assert (job.type, job.queue, job.priority, job.status) == (
        "send-invoice",
        "default",
        0,
        "pending",
    )
    assert job.payload == {"invoice_id": 42}
    assert job.retry_count == 0 and job.attempts == 0 and job.max_retries is None
    assert job.correlation_id  # generated
    fetched = await pgworker.get_job(conn, job.id)
    assert fetched == job
    assert await pgworker.get_job(conn, job.id + 1000) is None


async def test_priority_labels_and_options_are_stored(pool):
    at = datetime.now(UTC) + timedelta(hours=1)
    r = await pgworker.enqueue(
        pool,
        "t",
        {},
        priority="critical",
        queue="mail",
        max_retries=0,
        correlation_id="req-1",
        run_at=at,
    )
    assert (r.job.priority, r.job.queue, r.job.max_retries, r.job.correlation_id) == (
        30,
        "mail",
        0,
        "req-1",
    )
    assert abs((r.job.run_at - at).total_seconds()) < 0.001
    for label, value in {"low": 0, "medium": 10, "high": 20}.items():
        assert (await pgworker.enqueue(pool, "t", priority=label)).job.priority == value
    delayed = await pgworker.enqueue(pool, "t", delay=timedelta(seconds=30))
    assert (delayed.job.run_at - delayed.job.created_at).total_seconds() == pytest.approx(30, abs=1)


async def test_same_key_same_params_returns_existing_job(conn):
    first = await pgworker.enqueue(conn, "send-invoice", {"a": 1, "b": 2}, idempotency_key="k1")
    # Key order differs, and priority/queue differ: idempotency compares type and payload only.
    again = await pgworker.enqueue(
        conn, "send-invoice", {"b": 2, "a": 1}, idempotency_key="k1", priority="high", queue="q2"
    )
    assert first.created and not again.created
    assert again.job.id == first.job.id
    await conn.execute("UPDATE pgworker.jobs SET status = 'completed' WHERE id = $1", first.job.id)
    done = await pgworker.enqueue(conn, "send-invoice", {"a": 1, "b": 2}, idempotency_key="k1")
    assert not done.created and done.job.status == "completed"
    assert await count_jobs(conn) == 1


async def test_same_key_different_params_conflicts(conn):
    await pgworker.enqueue(conn, "send-invoice", {"a": 1}, idempotency_key="k1")
    with pytest.raises(pgworker.IdempotencyConflict) as info:
        await pgworker.enqueue(conn, "send-invoice", {"a": 2}, idempotency_key="k1")
    assert "k1" in str(info.value)
    with pytest.raises(pgworker.IdempotencyConflict):
        await pgworker.enqueue(conn, "other-type", {"a": 1}, idempotency_key="k1")
    assert isinstance(info.value, pgworker.PgWorkerError)
    assert await count_jobs(conn) == 1


async def test_fifty_concurrent_enqueues_of_one_key_make_one_row(dsn):
    conns = [await asyncpg.connect(dsn) for _ in range(50)]
    try:
        results = await asyncio.gather(
            *(pgworker.enqueue(c, "charge", {"order": 7}, idempotency_key="order-7") for c in conns)
        )
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    assert sum(r.created for r in results) == 1
    assert len({r.job.id for r in results}) == 1
    check = await asyncpg.connect(dsn)
    assert await count_jobs(check) == 1
    await check.close()


async def test_enqueue_in_rolled_back_transaction_leaves_no_job_and_no_notification(dsn, conn):
    listener = await asyncpg.connect(dsn)
    heard: list[str] = []
    await listener.add_listener("pgworker_jobs", lambda *a: heard.append(a[3]))
    try:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                r = await pgworker.enqueue(conn, "t", {"x": 1})
                assert await pgworker.get_job(conn, r.job.id) is not None
                raise RuntimeError("roll back")
        assert await count_jobs(conn) == 0
        async with conn.transaction():
            await pgworker.enqueue(conn, "t", {"x": 2}, queue="mail")
            await pgworker.enqueue(conn, "t", {"x": 3}, queue="mail")
        await listener.execute("SELECT 1")  # a round trip delivers pending notifications
        # One per committed statement and queue, none for the rollback: each says which job.
        notes = [json.loads(p) for p in heard]
        assert [(n["queue"], n["count"], n["types"]) for n in notes] == [("mail", 1, ["t"])] * 2
        assert notes[1]["id"] == notes[0]["id"] + 1
    finally:
        await listener.close()


async def test_every_enqueue_path_announces_new_jobs_once_per_queue(dsn, conn):
    listener = await asyncpg.connect(dsn)
    heard: list[str] = []
    await listener.add_listener("pgworker_jobs", lambda *a: heard.append(a[3]))

    async def announced() -> list[str]:
        await listener.execute("SELECT 1")  # a round trip delivers pending notifications
        got = sorted(json.loads(p)["queue"] for p in heard)
        heard.clear()
        return got

    try:
        await pgworker.enqueue(conn, "t", {"x": 1}, queue="a", idempotency_key="k")
        assert await announced() == ["a"]
        await pgworker.enqueue(conn, "t", {"x": 1}, queue="a", idempotency_key="k")
        assert await announced() == []  # nothing new
        copied = [JobSpec("t", {}, queue=q) for q in ("b", "c", "b")]
        await pgworker.enqueue_many(conn, copied)
        assert await announced() == ["b", "c"]
        keyed = [JobSpec("t", {}, queue="d", idempotency_key=f"k{i}") for i in range(3)]
        await pgworker.enqueue_many(conn, [*keyed, JobSpec("t", {"x": 1}, idempotency_key="k")])
        assert await announced() == ["d"]
        await pgworker.enqueue_many(conn, keyed)
        assert await announced() == []
    finally:
        await listener.close()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"type": ""}, "type"),
        ({"type": 5}, "type"),
        ({"priority": "urgent"}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"payload": {"when": datetime.now(UTC)}}, "payload"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": {"x": "nul\x00"}}, "payload"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at"),
        ({"run_at": datetime.now(UTC), "delay": 5}, "run_at"),
        ({"delay": -1}, "delay"),
        ({"delay": "soon"}, "delay"),
        ({"queue": ""}, "queue"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"correlation_id": ""}, "correlation_id"),
    ],
)
async def test_bad_input_raises_validation_error_naming_the_field(conn, kwargs, field):
    args = {"type": "t", "payload": {}} | kwargs
    with pytest.raises(ValidationError) as info:
        await pgworker.enqueue(conn, args.pop("type"), args.pop("payload"), **args)
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert await count_jobs(conn) == 0


async def test_enqueue_many_returns_results_in_order(pool):
    existing = await pgworker.enqueue(pool, "t", {"n": -1}, idempotency_key="dup")
    specs = [JobSpec("t", {"n": i}, priority=i % 3) for i in range(5)]
    specs.insert(2, JobSpec("t", {"n": -1}, idempotency_key="dup"))
    specs.append(JobSpec("t", {"n": 99}, idempotency_key="new"))
    specs.append(JobSpec("t", {"n": 99}, idempotency_key="new"))
    results = await pgworker.enqueue_many(pool, specs)
    assert [r.job.payload for r in results] == [s.payload for s in specs]
    assert [r.created for r in results] == [True, True, False, True, True, True, True, False]
    assert results[2].job.id == existing.job.id
    assert results[-1].job.id == results[-2].job.id
    async with pool.acquire() as c:
        assert await count_jobs(c) == 7


async def test_enqueue_many_is_all_or_nothing(conn):
    await pgworker.enqueue(conn, "t", {"n": 1}, idempotency_key="taken")
    with pytest.raises(pgworker.IdempotencyConflict):
        await pgworker.enqueue_many(
            conn, [JobSpec("t", {"n": 0}), JobSpec("t", {"n": 2}, idempotency_key="taken")]
        )
    with pytest.raises(ValidationError) as info:
        await pgworker.enqueue_many(conn, [JobSpec("t"), JobSpec("t", priority="nope")])
    assert info.value.field == "specs[1].priority"
    with pytest.raises(pgworker.IdempotencyConflict):
        await pgworker.enqueue_many(
            conn,
            [
                JobSpec("t", {"a": 1}, idempotency_key="x"),
                JobSpec("t", {"a": 2}, idempotency_key="x"),
            ],
        )
    assert await count_jobs(conn) == 1


async def test_enqueue_without_schema_says_to_migrate(empty_dsn):
    c = await asyncpg.connect(empty_dsn)
    try:
        with pytest.raises(pgworker.SchemaError, match="pgworker migrate"):
            await pgworker.enqueue(c, "t", {})
        for specs in ([JobSpec("t", {})], [JobSpec("t", {}, idempotency_key="k")]):
            with pytest.raises(pgworker.SchemaError, match="pgworker migrate"):
                await pgworker.enqueue_many(c, specs)
    finally:
        await c.close()


@pytest.mark.parametrize(
    "bad", [{"x": float("nan")}, {"x": "nul\x00"}, {"when": datetime.now(UTC)}, {1, 2}]
)
async def test_enqueue_many_names_the_payload_that_cannot_be_stored(conn, bad):
    with pytest.raises(ValidationError) as info:
        await pgworker.enqueue_many(conn, [JobSpec("t", {"ok": 1}), JobSpec("t", bad)])
    assert info.value.field == "specs[1].payload"
    assert await count_jobs(conn) == 0


async def test_enqueue_many_stores_null_payloads_as_enqueue_does_and_generates_correlation_ids(
    conn,
):
    results = await pgworker.enqueue_many(conn, [JobSpec("t", None), JobSpec("t", [1, "a"])])
    jobs = [await pgworker.get_job(conn, r.job.id) for r in results]
    assert [j.payload for j in jobs] == [r.job.payload for r in results] == [{}, [1, "a"]]
    scheduled = await pgworker.enqueue_many(conn, [JobSpec("t", None, delay=1)])  # the INSERT
    assert scheduled[0].job.payload == (await pgworker.get_job(conn, scheduled[0].job.id)).payload
    assert scheduled[0].job.payload == {}
    assert all(j.correlation_id for j in jobs)
    assert [r.job.correlation_id for r in results] == [j.correlation_id for j in jobs]
    assert results[0].job.correlation_id != results[1].job.correlation_id


async def test_enqueue_many_copy_path_makes_distinct_uuid_shaped_correlation_ids(conn):
    results = await pgworker.enqueue_many(conn, [JobSpec("t") for _ in range(1200)])
    made = [r.job.correlation_id for r in results]
    stored = await conn.fetch("SELECT id, correlation_id FROM pgworker.jobs ORDER BY id")
    assert [(r.job.id, r.job.correlation_id) for r in results] == [tuple(r) for r in stored]
    assert len(set(made)) == 1200
    assert all(re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", c) for c in made)


async def test_enqueue_many_both_paths_store_every_field(conn):
    at = datetime.now(UTC) + timedelta(hours=2)
    plain = await pgworker.enqueue_many(  # no keys, due now: COPY
        conn,
        [
            JobSpec(
                "a", {"n": 1}, queue="mail", priority="high", max_retries=2, correlation_id="req-1"
            ),
            JobSpec("b", {"n": 2}),
        ],
    )
    scheduled = await pgworker.enqueue_many(  # a schedule: one INSERT fed by a JSON array
        conn, [JobSpec("c", {"n": 3}, run_at=at), JobSpec("d", {"n": 4}, delay=60)]
    )
    assert [type(r.job.id) for r in plain] == [int, int]  # COPY's ids come back as text
    for r in plain + scheduled:
        stored = await pgworker.get_job(conn, r.job.id)
        assert stored.status == "pending" and r.created
        assert (stored.id, stored.created_at) == (r.job.id, r.job.created_at)
        assert (stored.type, stored.queue, stored.payload, stored.priority, stored.max_retries) == (
            r.job.type,
            r.job.queue,
            r.job.payload,
            r.job.priority,
            r.job.max_retries,
        )
        assert stored.correlation_id == r.job.correlation_id
        assert stored.run_at == r.job.run_at
    a = await pgworker.get_job(conn, plain[0].job.id)
    assert (a.queue, a.priority, a.max_retries, a.correlation_id) == ("mail", 20, 2, "req-1")
    assert plain[1].job.correlation_id and plain[1].job.correlation_id != "req-1"
    assert scheduled[0].job.run_at == at
    d = await pgworker.get_job(conn, scheduled[1].job.id)
    assert (d.run_at - d.created_at).total_seconds() == pytest.approx(60, abs=1)


async def test_enqueue_many_copy_path_keeps_text_that_copy_would_read_as_escapes(conn):
    odd = "tab\there\nnew\\line\r\\N"
    payload = {"s": odd, "path": "C:\\dir\\x00", "uni": "café ☕ \u2028", odd: [odd]}
    specs = [
        JobSpec(odd, payload, queue=odd, correlation_id=odd),
        JobSpec("plain", {"k": "\\"}, max_retries=0),
    ] * 3
    results = await pgworker.enqueue_many(conn, specs)
    assert len({r.job.id for r in results}) == 6
    for r, spec in zip(results, specs, strict=True):
        stored = await pgworker.get_job(conn, r.job.id)
        assert (stored.type, stored.queue, stored.payload) == (spec.type, r.job.queue, spec.payload)
        assert stored.correlation_id == r.job.correlation_id
        assert stored.max_retries == spec.max_retries
    assert results[0].job.queue == odd and results[0].job.correlation_id == odd


async def test_enqueue_many_copy_path_rolls_back_when_a_late_chunk_is_invalid(conn):
    specs = [JobSpec("t", {"n": i}) for i in range(1200)]
    specs[1100] = JobSpec("t", {"bad": float("inf")})
    async with conn.transaction():
        await pgworker.enqueue(conn, "before", {})
        with pytest.raises(ValidationError) as info:
            await pgworker.enqueue_many(conn, specs)
        assert info.value.field == "specs[1100].payload"
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 't'") == 0
        after = await pgworker.enqueue_many(conn, specs[:1100])
    assert len(after) == 1100
    assert await count_jobs(conn) == 1101


# --- one payload, one row, whatever the path --------------------------------


async def sql_function(conn: asyncpg.Connection, payload_json: str, key: str) -> tuple[int, bool]:
    row = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', $1::jsonb, idempotency_key => $2)", payload_json, key
    )
    return row["id"], row["created"]


async def test_null_and_equal_numbers_are_one_job_over_http_sql_and_python(
    server: Served, conn
) -> None:
    """A null payload is {} and numbers compare by value, whichever path comes first: HTTP,
    the SQL function, enqueue, enqueue_many."""
    async with server.client() as c:

        async def http(body: str) -> tuple[int, bool]:
            r = await c.post("/jobs", content=body, headers={"content-type": "application/json"})
            assert r.status_code in (200, 201), r.text
            return r.json()["id"], r.status_code == 201

        first = await http('{"type": "t", "payload": null, "idempotency_key": "null-1"}')
        assert first[1] is True
        assert await sql_function(conn, "null", "null-1") == (first[0], False)
        py = await pgworker.enqueue(conn, "t", None, idempotency_key="null-1")
        assert (py.job.id, py.created) == (first[0], False)
        made = await sql_function(conn, "null", "null-2")
        assert await http('{"type": "t", "payload": null, "idempotency_key": "null-2"}') == (
            made[0],
            False,
        )
        [many] = await pgworker.enqueue_many(conn, [JobSpec("t", None, idempotency_key="null-2")])
        assert (many.job.id, many.created) == (made[0], False)

        numbers = await http(
            '{"type": "t", "payload": {"a": 1, "b": [100]}, "idempotency_key": "n"}'
        )
        for body in ('{"a": 1.0, "b": [1e2]}', '{"b": [100.00], "a": 1}'):
            again = await http(f'{{"type": "t", "payload": {body}, "idempotency_key": "n"}}')
            assert again == (numbers[0], False)
            assert await sql_function(conn, body, "n") == (numbers[0], False)
        py = await pgworker.enqueue(conn, "t", {"a": 1.0, "b": [100.0]}, idempotency_key="n")
        assert (py.job.id, py.created) == (numbers[0], False)
        different = await c.post(
            "/jobs", json={"type": "t", "payload": {"a": 2, "b": [100]}, "idempotency_key": "n"}
        )
        assert different.status_code == 409, different.text
    rows = await conn.fetch("SELECT idempotency_key, payload FROM pgworker.jobs ORDER BY id")
    assert [(r["idempotency_key"], json.loads(r["payload"])) for r in rows] == [
        ("null-1", {}),
        ("null-2", {}),
        ("n", {"a": 1, "b": [100]}),
    ]


async def test_a_batch_compares_a_repeated_key_by_json_value(conn):
    results = await pgworker.enqueue_many(
        conn,
        [
            JobSpec("t", {"a": 1, "n": [2]}, idempotency_key="k"),
            JobSpec("t", {"n": [2.0], "a": 1.0}, idempotency_key="k"),
            JobSpec("t", None, idempotency_key="null"),
            JobSpec("t", {}, idempotency_key="null"),
        ],
    )
    assert [r.created for r in results] == [True, False, True, False]
    assert results[1].job.id == results[0].job.id and results[3].job.id == results[2].job.id
    for other in ({"a": True, "n": [2]}, {"a": 1, "n": [2.5]}, {"a": 1, "n": (2, 3)}):
        with pytest.raises(pgworker.IdempotencyConflict):
            await pgworker.enqueue_many(
                conn,
                [
                    JobSpec("t", {"a": 1, "n": [2]}, idempotency_key="new", delay=1),
                    JobSpec("t", other, idempotency_key="new", delay=1),
                ],
            )
    # A key held before the batch: compared by the database, by value as well.
    [held] = await pgworker.enqueue_many(
        conn, [JobSpec("t", {"a": 1.0, "n": [2]}, idempotency_key="k")]
    )
    assert (held.job.id, held.created) == (results[0].job.id, False)
    assert await count_jobs(conn) == 2


# --- registry.enqueue of a type it has no task for --------------------------


async def test_registry_enqueue_refuses_a_type_it_has_no_task_for(conn):
    registry = pgworker.Registry()
    for name in ("send-invoice", "send-receipt"):
        registry.task(name)(lambda ctx, payload: None)
    with pytest.raises(ValidationError) as caught:
        await registry.enqueue(conn, "send-invoce", {"invoice_id": 42})
    message = str(caught.value)
    assert caught.value.field == "type"
    assert "'send-invoce' is not a task of this registry" in message
    assert "did you mean 'send-invoice'?" in message
    assert "'send-invoice', 'send-receipt'" in message
    assert "pgworker.enqueue(conn, type, ...)" in message
    many = pgworker.Registry()
    for n in range(50):
        many.task(f"task-{n:02}")(lambda ctx, payload: None)
    with pytest.raises(ValidationError) as caught:
        await many.enqueue(conn, "x" * 10_000)
    assert caught.value.field == "type" and "and 30 more" in str(caught.value)
    assert len(str(caught.value)) < 1000
    with pytest.raises(ValidationError, match="this registry has no tasks"):
        await pgworker.Registry().enqueue(conn, "t")
    assert await count_jobs(conn) == 0
    # The way to enqueue a type served elsewhere.
    assert (await pgworker.enqueue(conn, "send-invoce", {})).created


# --- an unusable asyncpg connection -----------------------------------------


async def test_an_aborted_transaction_on_asyncpg_says_to_roll_back(conn):
    """As on psycopg: PgWorkerError saying to roll back, asyncpg's error as its cause."""
    for call in (
        partial(pgworker.enqueue, conn, "t", {}),
        partial(pgworker.enqueue, conn, "t", {}, idempotency_key="k"),
        partial(pgworker.enqueue_many, conn, [JobSpec("t", {})]),  # COPY
        partial(pgworker.enqueue_many, conn, [JobSpec("t", {}, idempotency_key="k")]),  # INSERT
    ):
        tx = conn.transaction()
        await tx.start()
        with pytest.raises(asyncpg.UndefinedTableError):
            await conn.execute("SELECT * FROM no_such_table")
        with pytest.raises(pgworker.PgWorkerError) as caught:
            await call()
        await tx.rollback()
        assert "the asyncpg Connection's transaction is aborted" in str(caught.value)
        assert "roll it back, then enqueue: nothing was written" in str(caught.value)
        assert isinstance(caught.value.__cause__, asyncpg.InFailedSQLTransactionError)
    assert await count_jobs(conn) == 0


async def test_a_closed_asyncpg_connection_or_pool_says_to_reconnect(dsn, conn):
    """As on psycopg: DatabaseUnavailable saying to reconnect, asyncpg's error as its cause."""
    closed = await asyncpg.connect(dsn)
    await closed.close()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
    async with pool.acquire() as released:
        pass
    await pool.close()
    for target, name in (
        (closed, "asyncpg Connection"),
        (released, "asyncpg Connection"),
        (pool, "asyncpg Pool"),
    ):
        for call in (
            partial(pgworker.enqueue, target, "t", {}),
            partial(pgworker.enqueue_many, target, [JobSpec("t", {})]),
            partial(pgworker.enqueue_many, target, [JobSpec("t", {}, idempotency_key="k")]),
        ):
            with pytest.raises(pgworker.DatabaseUnavailable) as caught:
                await call()
            assert f"the {name} is closed; reconnect" in str(caught.value), caught.value
            assert "nothing was written" in str(caught.value)
            assert isinstance(caught.value.__cause__, asyncpg.InterfaceError)
    assert await count_jobs(conn) == 0


# --- the last representable moment -----------------------------------------------------------


LAST_MICROSECOND = datetime.max.replace(tzinfo=UTC)


async def test_the_last_microsecond_as_run_at_does_not_park_a_job_forever(conn) -> None:
    """run_at=datetime.max (UTC) would be stored as 'infinity', the run_at of a parked job that
    nothing releases (and update_job would then refuse to reschedule it): it is kept one
    microsecond earlier, a finite time, by enqueue and by update_job."""
    job = await pgworker.enqueue(conn, "t", {}, run_at=LAST_MICROSECOND)
    finite = "SELECT isfinite(run_at) FROM pgworker.jobs WHERE id = $1"
    assert await conn.fetchval(finite, job.job.id)
    other = await pgworker.enqueue(conn, "t", {})
    await pgworker.update_job(conn, other.job.id, run_at=LAST_MICROSECOND)
    assert await conn.fetchval(finite, other.job.id)
    # Still a time update_job changes: the job is not parked.
    await pgworker.update_job(conn, job.job.id, run_at=datetime(2030, 1, 1, tzinfo=UTC))


# --- Registry.enqueue's defaults -------------------------------------------------------------


async def test_registry_enqueue_fills_in_only_what_the_caller_left_out(conn):
    registry = pgworker.Registry()

    @registry.task("mail-out", queue="mail", priority="high", max_retries=5)
    async def mail_out(ctx, payload):
        pass

    async def stored(result) -> tuple:
        job = await pgworker.get_job(conn, result.job.id)
        return job.queue, job.priority, job.max_retries

    assert await stored(await registry.enqueue(conn, "mail-out", {"n": 1})) == ("mail", 20, 5)
    given = await registry.enqueue(
        conn, "mail-out", {"n": 2}, queue="bulk", priority=0, max_retries=0
    )
    assert await stored(given) == ("bulk", 0, 0)  # 0 is a value, not "none given"
    partly = await registry.enqueue(conn, "mail-out", {"n": 3}, priority="low")
    assert await stored(partly) == ("mail", 0, 5)
    with pytest.raises(pgworker.ValidationError) as unknown:  # a typo is not sent to `default`
        await registry.enqueue(conn, "unknown", {})
    assert unknown.value.field == "type"
