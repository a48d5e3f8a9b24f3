"""Hypothesis-generated enqueue arguments: any arguments create a valid job or raise
ValidationError and never leave a partial row; valid arguments are accepted, through `enqueue`
and both paths of `enqueue_many`, and stored as given. Runs are derandomized: a failure
replays as is."""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pgworker
from pgworker import _validate as validate

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
payloads = (
    json_values
    | st.builds(object)
    | st.just({"when": datetime.now(UTC)})
    | st.just({"s": "\udcff"})
    | st.just({"s": "\x00"})
)
texts = (
    st.none()
    | st.text(max_size=12)
    | st.integers()
    | st.just("\udcff")
    | st.text(min_size=501, max_size=510)
)
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
    | st.just(1e13)
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


replayable = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@replayable
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


# Valid arguments: text that PostgreSQL stores (no NUL, no lone surrogate) within the bounds.
storable = st.characters(codec="utf-8", exclude_characters="\x00")


def names(max_size: int) -> st.SearchStrategy[str]:
    return st.text(storable, min_size=1, max_size=max_size)


valid_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**62), 2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(storable, max_size=20)
    | st.just("\\u0000"),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(storable, max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
valid_priorities = (
    st.none()
    | st.integers(validate.MIN_INT, validate.MAX_INT)
    | st.sampled_from(list(pgworker.PRIORITY_LABELS))
)
valid_schedules = st.one_of(
    st.none(),
    st.builds(
        lambda at: ("run_at", at),
        st.datetimes(
            min_value=datetime(2000, 1, 1),
            max_value=datetime(2100, 1, 1),
            timezones=st.just(UTC) | st.just(timezone(timedelta(hours=-7, minutes=-30))),
        ),
    ),
    st.builds(lambda d: ("delay", d), st.floats(0, validate.MAX_DELAY) | st.integers(0, 10**6)),
    st.builds(
        lambda d: ("delay", d),
        st.timedeltas(min_value=timedelta(0), max_value=timedelta(seconds=validate.MAX_DELAY)),
    ),
)
_keys = itertools.count()


@replayable
@given(
    type_=names(validate.MAX_TYPE_LENGTH),
    payload=valid_json,
    queue=st.none() | names(validate.MAX_QUEUE_LENGTH),
    priority=valid_priorities,
    retries=st.none() | st.integers(0, validate.MAX_INT),
    key=st.none() | names(validate.MAX_IDEMPOTENCY_KEY_LENGTH - 12),
    correlation=st.none() | names(validate.MAX_CORRELATION_ID_LENGTH),
    schedule=valid_schedules,
    path=st.sampled_from(["enqueue", "enqueue_many"]),
)
def test_valid_arguments_are_accepted_and_stored_as_given(
    loop, dsn, type_, payload, queue, priority, retries, key, correlation, schedule, path
):
    if key is not None:
        key = f"{key}-{next(_keys)}"  # examples share a database: a key is never reused
    when = dict([schedule]) if schedule else {}

    async def attempt():
        conn = await asyncpg.connect(dsn)
        try:
            options = dict(
                queue=queue,
                priority=priority,
                max_retries=retries,
                idempotency_key=key,
                correlation_id=correlation,
                **when,
            )
            if path == "enqueue":
                result = await pgworker.enqueue(conn, type_, payload, **options)
            else:
                spec = pgworker.JobSpec(type_, payload, **options)
                [result] = await pgworker.enqueue_many(conn, [spec])
            assert result.created
            job = await pgworker.get_job(conn, result.job.id)
            assert (job.status, job.type, job.queue) == ("pending", type_, queue or "default")
            assert _same_json(job.payload, payload)  # None means {} on both paths
            expected = pgworker.PRIORITY_LABELS.get(priority, priority) if priority else 0
            assert job.priority == expected
            assert (job.max_retries, job.idempotency_key) == (retries, key)
            if correlation is not None:
                assert job.correlation_id == correlation
            if "run_at" in when:
                assert job.run_at == when["run_at"]
            else:
                delay = when.get("delay", 0)
                seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
                assert (job.run_at - job.created_at).total_seconds() == pytest.approx(
                    seconds, abs=1e-3
                )
            assert result.job.run_at == job.run_at and result.job.priority == job.priority
        finally:
            await conn.close()

    loop.run_until_complete(attempt())
