"""Hypothesis-generated enqueue arguments: each call creates a valid job or raises
ValidationError, and never leaves a partial row."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgworker

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
payloads = json_values | st.builds(object) | st.just({"when": datetime.now(UTC)})
texts = st.none() | st.text(max_size=12) | st.integers()
priorities = (
    st.none()
    | st.integers(-(2**33), 2**33)
    | st.sampled_from(["low", "medium", "high", "critical", "urgent", ""])
    | st.floats()
)
max_retries = st.none() | st.integers(-5, 2**32) | st.booleans()
run_ats = st.none() | st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.none() | st.just(UTC) | st.just(timezone(timedelta(hours=5))),
)
delays = (
    st.none()
    | st.floats(-10, 1e6)
    | st.integers(-10, 10**6)
    | st.timedeltas(min_value=timedelta(seconds=-5), max_value=timedelta(days=30))
)


def _equal(a, b) -> bool:
    """JSON equality where numbers compare by value (jsonb prints 1e300 as digits)."""
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool | type(None)):
        return not isinstance(b, bool) and (a == b or float(a) == float(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _same_json(stored, given_value) -> bool:
    """The stored payload is the given one after a JSON round trip; None means {}."""
    return _equal(stored, {} if given_value is None else json.loads(json.dumps(given_value)))


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    type_=texts,
    payload=payloads,
    queue=texts,
    priority=priorities,
    retries=max_retries,
    key=texts,
    correlation=texts,
    run_at=run_ats,
    delay=delays,
)
def test_enqueue_creates_a_valid_job_or_raises_validation_error(
    loop, dsn, type_, payload, queue, priority, retries, key, correlation, run_at, delay
):
    async def attempt():
        conn = await asyncpg.connect(dsn)
        try:
            before = await conn.fetchval("SELECT count(*) FROM pgworker.jobs")
            try:
                result = await pgworker.enqueue(
                    conn,
                    type_,
                    payload,
                    queue=queue,
                    priority=priority,
                    max_retries=retries,
                    idempotency_key=key,
                    correlation_id=correlation,
                    run_at=run_at,
                    delay=delay,
                )
            except pgworker.ValidationError as exc:
                assert exc.field in {
                    "type",
                    "payload",
                    "queue",
                    "priority",
                    "max_retries",
                    "idempotency_key",
                    "correlation_id",
                    "run_at",
                    "delay",
                }
                assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == before
                return
            except pgworker.IdempotencyConflict:
                assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == before
                return
            after = await conn.fetchval("SELECT count(*) FROM pgworker.jobs")
            assert after == before + (1 if result.created else 0)
            job = await pgworker.get_job(conn, result.job.id)
            assert job.status == "pending"
            if result.created:
                assert job.type == type_ and _same_json(job.payload, payload)
                assert job.queue == (queue or "default")
                if correlation is not None:
                    assert job.correlation_id == correlation
                if isinstance(retries, int):
                    assert job.max_retries == retries
                if run_at is not None:
                    assert job.run_at == run_at
        finally:
            await conn.close()

    loop.run_until_complete(attempt())
