"""Inputs that used to pass the boundary and then break a claim,
an outcome write or a read, or come out of the CLI as a traceback. Each is now refused where it
enters, by a ValidationError or ConfigError naming the field (or one line and exit status 2 from
the CLI), and nothing is written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest

import pgworker
from pgworker import ConfigError, JobSpec, Retry, RetryPolicy, Settings, ValidationError
from pgworker import _validate as validate
from pgworker.operations import status

from .helpers import ROOT, cli, database_of, has_status
from .test_cli import cli_env

SURROGATE = "\udcff"
DSN = "postgresql://x@127.0.0.1:1/x"


async def count_jobs(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


async def refused(conn: asyncpg.Connection, field: str, **kwargs: object) -> None:
    """`enqueue`, and `enqueue_many` through COPY and through INSERT, refuse these arguments
    with a ValidationError naming `field`, and write nothing."""
    args = {"type": "t", "payload": {}} | kwargs
    type_, payload = args.pop("type"), args.pop("payload")
    with pytest.raises(ValidationError) as info:
        await pgworker.enqueue(conn, type_, payload, **args)
    assert info.value.field == field, info.value
    batches = [
        [JobSpec("ok", {"n": 1}), JobSpec(type_, payload, **args)],  # COPY unless scheduled
        [JobSpec("ok", {"n": 1}, delay=0), JobSpec(type_, payload, **args)],  # INSERT
    ]
    for specs in batches:
        with pytest.raises(ValidationError) as info:
            await pgworker.enqueue_many(conn, specs)
        assert info.value.field == f"specs[1].{field}", info.value
    assert await count_jobs(conn) == 0


# --- I: Retry(after=...) and the backoff are bounded -------------------------------------------


def test_I_retry_after_that_cannot_be_scheduled_is_a_validation_error():
    bad = [math.inf, -math.inf, math.nan, -1, 1e13, timedelta.max, validate.MAX_DELAY + 1, "1"]
    for after in bad:
        with pytest.raises(ValidationError) as info:
            Retry(after=after)
        assert info.value.field == "after", after
        assert isinstance(info.value, pgworker.PgWorkerError)
    assert Retry(after=validate.MAX_DELAY).after == validate.MAX_DELAY
    assert Retry(after=timedelta(minutes=2)).after == 120.0
    assert Retry().after == 0.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial_delay": 1e13, "max_delay": 1e13}, "initial_delay"),
        ({"max_delay": 1e13}, "max_delay"),
        ({"max_delay": timedelta.max.total_seconds()}, "max_delay"),
        ({"max_retries": 2**31}, "max_retries"),
    ],
)
def test_I_retry_policy_delays_and_counts_are_bounded(kwargs, field):
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)
    assert info.value.field == field


# --- K: names and durations have upper bounds --------------------------------------------------


@pytest.mark.asyncio
async def test_K_job_type_of_3000_characters_is_refused_at_enqueue(conn):
    await refused(conn, "type", type="t" * 3000)
    await refused(conn, "type", type="t" * (validate.MAX_TYPE_LENGTH + 1))
    at_limit = await pgworker.enqueue(conn, "t" * validate.MAX_TYPE_LENGTH, {})
    assert (await pgworker.get_job(conn, at_limit.job.id)).type == "t" * validate.MAX_TYPE_LENGTH


@pytest.mark.asyncio
async def test_K_long_idempotency_key_and_correlation_id_are_refused(conn):
    await refused(conn, "idempotency_key", idempotency_key="k" * 3000)
    await refused(
        conn, "correlation_id", correlation_id="c" * (validate.MAX_CORRELATION_ID_LENGTH + 1)
    )
    key = "k" * validate.MAX_IDEMPOTENCY_KEY_LENGTH
    assert (await pgworker.enqueue(conn, "t", {}, idempotency_key=key)).created


def test_K_settings_beyond_their_documented_maximum_are_a_config_error():
    for field, value in [
        ("lease", 1e13),
        ("lease", validate.MAX_LEASE + 1),
        ("poll_interval", 1e13),
        ("shutdown_timeout", 1e13),
        ("concurrency", 10**9),
        ("worker_id", "w" * 3000),
        ("worker_id", f"w{SURROGATE}"),
        ("queues", ("q" * 64,)),
        ("queues", (f"q{SURROGATE}",)),
    ]:
        with pytest.raises(ConfigError) as info:
            Settings(dsn="postgresql://x", **{field: value})
        assert info.value.field == field, (field, value)
    assert Settings(dsn="postgresql://x", lease=1).lease == 1
    assert Settings(dsn="postgresql://x", lease=validate.MAX_LEASE).lease == validate.MAX_LEASE


# --- L: every promised ValidationError comes out as one ----------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "payload",
    [
        {"s": SURROGATE},
        {SURROGATE: 1},
        [f"ok {SURROGATE}"],
        f"\ud800{SURROGATE}",
    ],
)
async def test_L_lone_surrogate_in_payload_is_a_validation_error(conn, payload):
    await refused(conn, "payload", payload=payload)


@pytest.mark.asyncio
@pytest.mark.parametrize("field", ["type", "queue", "idempotency_key", "correlation_id"])
async def test_L_lone_surrogate_in_a_name_is_a_validation_error(conn, field):
    if field == "type":
        await refused(conn, "type", type=f"t{SURROGATE}")
    else:
        await refused(conn, field, **{field: f"x{SURROGATE}"})


@pytest.mark.asyncio
async def test_L_delay_above_the_maximum_is_a_validation_error(conn):
    for delay in (1e13, timedelta.max, validate.MAX_DELAY + 1):
        await refused(conn, "delay", delay=delay)
    r = await pgworker.enqueue(conn, "t", {}, delay=validate.MAX_DELAY)
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.run_at - job.created_at).total_seconds() == pytest.approx(validate.MAX_DELAY)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "run_at",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
async def test_L_run_at_outside_the_storable_range_is_a_validation_error(conn, run_at):
    await refused(conn, "run_at", run_at=run_at)


@pytest.mark.asyncio
async def test_L_queue_longer_than_notify_allows_is_a_validation_error(conn):
    await refused(conn, "queue", queue="q" * 8001)
    await refused(conn, "queue", queue="q" * (validate.MAX_QUEUE_LENGTH + 1))
    r = await pgworker.enqueue(conn, "t", {}, queue="q" * validate.MAX_QUEUE_LENGTH)
    assert r.job.queue == "q" * validate.MAX_QUEUE_LENGTH


@pytest.mark.asyncio
async def test_L_payload_over_the_size_limit_is_a_validation_error(conn, monkeypatch):
    monkeypatch.setattr(validate, "MAX_PAYLOAD_BYTES", 1000)
    await refused(conn, "payload", payload={"s": "x" * 1000})
    await refused(conn, "payload", payload={"s": "é" * 499})  # 1,006 bytes as JSON
    assert (await pgworker.enqueue(conn, "t", {"s": "x" * 900})).created


@pytest.mark.asyncio
async def test_L_payload_nested_beyond_the_depth_limit_is_refused_at_enqueue(conn):
    """A payload nested ~985 deep used to be stored, then `result.job` and every claim raised
    RecursionError."""
    await refused(conn, "payload", payload=nested(985))
    await refused(conn, "payload", payload={"a": nested(validate.MAX_DEPTH)})
    deepest = nested(validate.MAX_DEPTH - 1)
    r = await pgworker.enqueue(conn, "t", deepest)
    assert r.job.payload == deepest
    assert (await pgworker.get_job(conn, r.job.id)).payload == deepest


@pytest.mark.asyncio
async def test_L_the_text_backslash_u0000_is_accepted_and_a_real_nul_refused(conn):
    harmless = {"s": "\\u0000", "\\u0000": ["a\\\\u0000", "\\\\\\u0000"]}
    results = [await pgworker.enqueue(conn, "t", harmless)]
    results += await pgworker.enqueue_many(conn, [JobSpec("t", harmless)] * 2)
    results += await pgworker.enqueue_many(conn, [JobSpec("t", harmless, delay=0)] * 2)
    for r in results:
        assert (await pgworker.get_job(conn, r.job.id)).payload == harmless
    await conn.execute("DELETE FROM pgworker.jobs")
    for payload in ({"s": "\x00"}, {"s": "\\\x00"}, {"\x00": 1}, ["\\\\\x00"]):
        await refused(conn, "payload", payload=payload)


@pytest.mark.asyncio
async def test_L_enqueue_many_refuses_a_surrogate_inside_the_callers_transaction(conn):
    async with conn.transaction():
        await pgworker.enqueue(conn, "before", {})
        specs = [JobSpec("t", {"n": i}) for i in range(1200)]
        specs[1100] = JobSpec("t", {"s": SURROGATE})
        with pytest.raises(ValidationError) as info:
            await pgworker.enqueue_many(conn, specs)
        assert info.value.field == "specs[1100].payload"
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 't'") == 0
    assert await count_jobs(conn) == 1


@pytest.mark.asyncio
async def test_L_priority_and_max_retries_are_int32(conn):
    await refused(conn, "priority", priority=2**31)
    await refused(conn, "max_retries", max_retries=2**31)
    low = await pgworker.enqueue(conn, "t", {}, priority=-(2**31), max_retries=2**31 - 1)
    assert (await pgworker.get_job(conn, low.job.id)).priority == -(2**31)


# --- M: the CLI answers a poison argument with one line and exit status 2 ----------------------


def one_line_error(out: subprocess.CompletedProcess[str], command: str, message: str) -> None:
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.endswith("\n"), out.stderr
    assert out.stderr.startswith(f"pgworker {command}: error: "), out.stderr
    assert message in out.stderr, out.stderr


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "args",
    [
        ("migrate",),
        ("enqueue", "t"),
        ("cancel", "1"),
        ("status",),
    ],
)
async def test_M_bad_schema_is_one_line_and_exit_2(args, dsn):
    out = cli(*args, "--schema", "bad-name", "--dsn", dsn)
    one_line_error(out, args[0], "schema")
    assert "bad-name" in out.stderr


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("enqueue", "t", "--payload", json.dumps({"s": SURROGATE})), "payload: must be valid"),
        (("enqueue", "t", "--payload", "[" * 5000 + "]" * 5000), "payload: must not nest"),
        (("enqueue", "t", "--payload", "[" * 600 + "]" * 600), "payload: must not nest"),
        (("enqueue", "t", "--delay", "1e13"), "delay: must be at most"),
        (("enqueue", "t" * 3000), "type: must be at most 200 characters"),
        (("cancel", str(10**21)), "job id"),
        (("cancel", "x"), "job id"),
    ],
)
async def test_M_poison_arguments_are_one_line_and_exit_2(args, message, dsn, conn):
    out = cli(*args, "--dsn", dsn)
    one_line_error(out, args[0], message)
    assert await count_jobs(conn) == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("option", "value", "field"),
    [
        ("--lease", "1e13", "lease"),
        ("--concurrency", "1000000000", "concurrency"),
        ("--worker-id", "w" * 300, "worker_id"),
    ],
)
async def test_M_run_refuses_settings_beyond_their_bounds(option, value, field, dsn, conn):
    out = cli("run", "tests.apps.basic", option, value, "--dsn", dsn, timeout=20)
    one_line_error(out, "run", f"{field}: must")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0


@pytest.mark.asyncio
async def test_M_handler_module_raising_at_import_shows_its_traceback_then_one_line(dsn):
    out = cli("run", "tests.apps.raises_at_import", "--dsn", dsn)
    assert out.returncode == 2, out
    lines = out.stderr.rstrip("\n").splitlines()
    assert lines[0] == "Traceback (most recent call last):", out.stderr
    assert 'tests/apps/raises_at_import.py", line' in out.stderr
    assert lines[-2] == "RuntimeError: the handlers need SETTINGS_URL", out.stderr
    assert lines[-1] == (
        "pgworker run: error: module: importing 'tests.apps.raises_at_import' raised "
        "RuntimeError: the handlers need SETTINGS_URL"
    )
    assert "pgworker/cli/" not in out.stderr and "importlib" not in out.stderr


@pytest.mark.asyncio
async def test_M_migrate_against_a_missing_database_says_it_does_not_exist(server_dsn):
    from .conftest import with_database

    out = cli("migrate", "--dsn", with_database(server_dsn, "pgworker_no_such_db"))
    one_line_error(out, "migrate", 'database "pgworker_no_such_db" does not exist')
    assert "PostgreSQL is running" not in out.stderr


def test_M_stdlib_logging_comes_out_as_structured_lines():
    """asyncpg logs "Failed to restore the pool connection floor" with a traceback through the
    standard `logging` module: with the CLI's configuration it is one JSON line on stderr."""
    script = """
import logging
from pgworker._logs import configure
configure("json", "info")
try:
    raise ConnectionRefusedError("connection refused")
except OSError:
    logging.getLogger("asyncpg.pool").warning(
        "Failed to restore the pool connection floor; retrying", exc_info=True
    )
logging.getLogger("asyncpg.pool").debug("hidden below the level")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=cli_env(), cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout == "", out
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    line = json.loads(lines[0])
    assert line["event"] == "Failed to restore the pool connection floor; retrying"
    assert (line["level"], line["logger"]) == ("warning", "asyncpg.pool")
    assert "ConnectionRefusedError: connection refused" in line["exception"]
    assert datetime.fromisoformat(line["timestamp"]).tzinfo == UTC


@pytest.mark.asyncio
async def test_M_asyncpg_pool_warnings_from_a_real_worker_are_json_lines(
    dsn, conn, server_dsn, tmp_path
):
    """A worker whose connections are cut while its database refuses new ones: asyncpg's pool
    logs "Failed to restore the pool connection floor" with a traceback; with --log-format
    json it is a JSON line like every other line of stderr, and a DEBUG one (the worker says
    once that the database is unreachable: no third-party traceback at WARNING)."""
    from .helpers import spawn_worker, wait_for

    name = database_of(dsn)
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        "tests.apps.basic", dsn, log, "--log-format", "json", "--log-level", "debug"
    )
    try:
        # Started, not only registered: a start-up whose LISTEN connection is refused exits 2.
        await wait_for(lambda: "worker started" in log.read_text(), 30)
        admin = await asyncpg.connect(server_dsn)
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = $1 AND application_name LIKE 'pgworker%'",
                name,
            )
            await wait_for(lambda: "pool connection floor" in log.read_text(), timeout=30)
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await admin.close()
    finally:
        worker.terminate()
        assert worker.wait(timeout=60) == 0
    lines = log.read_text().splitlines()
    parsed = [json.loads(line) for line in lines]  # every line is one JSON object
    floor = [x for x in parsed if "pool connection floor" in x["event"]]
    assert floor and floor[0]["logger"] == "asyncpg.pool", lines
    assert "Traceback" in floor[0]["exception"]
    assert {x["level"] for x in floor} == {"debug"}, floor


# --- ids past bigint, a bad --live-within, rows too deep to decode ---------------------------


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("bad", [True, "1", 1.0, 2**63, 0, None])
async def test_a_job_id_that_is_not_a_bigint_is_a_validation_error_naming_it(conn, bad):
    """get_job and cancel passed the id to asyncpg as given: "1" or 2**63 raised asyncpg's
    DataError, 1.0 was rounded, and True read and cancelled job 1."""
    first = await pgworker.enqueue(conn, "t", {})
    assert first.job.id == 1
    for call in (pgworker.get_job, pgworker.cancel):
        with pytest.raises(pgworker.ValidationError, match="job_id") as info:
            await call(conn, bad)
        assert info.value.field == "job_id"
    assert await has_status(conn, first.job.id, "pending")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("bad", [float("nan"), "60", 1e300, -1, 0])
async def test_status_with_a_bad_live_within_is_a_validation_error_naming_it(conn, bad):
    with pytest.raises(pgworker.ValidationError, match="live_within"):
        await status(conn, live_within=bad)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_row_too_deep_to_decode_is_a_typed_error_naming_the_job_and_column(conn):
    """A payload or result nested past Python's recursion, written around enqueue: get_job
    raised a bare RecursionError. (A worker fails such a job; operators then read it.)"""
    depth = 5000
    job_id = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, payload) VALUES ('t', $1::jsonb) RETURNING id",
        "[" * depth + "]" * depth,
    )
    with pytest.raises(pgworker.PgWorkerError, match=rf"payload: .*job {job_id}.*SQL"):
        await pgworker.get_job(conn, job_id)
    await conn.execute(
        "UPDATE pgworker.jobs SET payload = '{}', result = $2::jsonb WHERE id = $1",
        job_id,
        '{"a":' * depth + "1" + "}" * depth,
    )
    with pytest.raises(pgworker.PgWorkerError, match=rf"result: .*job {job_id}"):
        await pgworker.get_job(conn, job_id)
