"""Enqueue against a real PostgreSQL: idempotency, transactions, validation, batches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

import pgworker
from pgworker import JobSpec, ValidationError

pytestmark = pytest.mark.asyncio(loop_scope="session")


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
        assert heard == ["mail"]  # one per committed transaction and queue, none for the rollback
    finally:
        await listener.close()


async def test_every_enqueue_path_announces_new_jobs_once_per_queue(dsn, conn):
    listener = await asyncpg.connect(dsn)
    heard: list[str] = []
    await listener.add_listener("pgworker_jobs", lambda *a: heard.append(a[3]))

    async def announced() -> list[str]:
        await listener.execute("SELECT 1")  # a round trip delivers pending notifications
        got = sorted(heard)
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
    for r in plain + scheduled:
        stored = await pgworker.get_job(conn, r.job.id)
        assert stored.status == "pending" and r.created
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
