"""Retry policy, task options and settings: errors name the field; delays follow the formula."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

import pgworker
from pgworker import ConfigError, RetryPolicy, Settings
from pgworker import _validate as validate
from pgworker._runtime import notifier as _notifier

from .helpers import serving_guarded, wait_for


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"initial_delay": 0}, "initial_delay"),
        ({"initial_delay": -1.0}, "initial_delay"),
        ({"initial_delay": 10, "max_delay": 5}, "max_delay"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": -0.1}, "jitter"),
        ({"max_delay": float("inf")}, "max_delay"),
    ],
)
def test_retry_policy_rejects_bad_numbers(kwargs, field):
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)
    assert info.value.field == field
    assert isinstance(info.value, pgworker.PgWorkerError)


def test_backoff_doubles_up_to_the_cap_within_jitter():
    policy = RetryPolicy(initial_delay=1.0, max_delay=10.0, jitter=0.1)
    rand = random.Random(7)
    for n, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (50, 10.0), (10**6, 10.0)]:
        for _ in range(20):
            assert base * 0.9 <= policy.delay(n, rand) <= base * 1.1
    exact = RetryPolicy(initial_delay=0.5, max_delay=300, jitter=0)
    assert [exact.delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]


def test_task_options_are_validated():
    registry = pgworker.Registry()
    with pytest.raises(ConfigError, match="priority"):
        registry.task("a", priority="urgent")
    with pytest.raises(ConfigError, match="timeout"):
        registry.task("a", timeout=0)
    with pytest.raises(ConfigError, match="max_retries"):
        registry.task("a", max_retries=2, retry=RetryPolicy(max_retries=5))
    with pytest.raises(ConfigError, match="name"):
        registry.task("")

    @registry.task("a", max_retries=7, priority="high", queue="mail", timeout=5)
    async def a(ctx, payload):
        pass

    @registry.task("b")
    def b(ctx, payload):
        pass

    with pytest.raises(ConfigError, match="already registered"):
        registry.task("a")
    task = registry["a"]
    assert (task.retry.max_retries, task.priority, task.queue, task.timeout, task.is_async) == (
        7,
        20,
        "mail",
        5.0,
        True,
    )
    assert registry["b"].retry == RetryPolicy() and registry["b"].is_async is False
    assert registry.queues() == ["default", "mail"]


def test_settings_validate_and_read_the_environment():
    env = {
        "DATABASE_URL": "postgresql://db/x",
        "PGWORKER_CONCURRENCY": "4",
        "PGWORKER_QUEUES": "a, b",
        "PGWORKER_LISTEN": "false",
    }
    s = Settings.from_env(env)
    assert (s.dsn, s.concurrency, s.queues, s.listen) == ("postgresql://db/x", 4, ("a", "b"), False)
    assert s.durable_claims is False
    assert Settings.from_env({**env, "PGWORKER_DURABLE_CLAIMS": "yes"}).durable_claims is True
    with pytest.raises(ConfigError, match="PGWORKER_DURABLE_CLAIMS='maybe' must be true or false"):
        Settings.from_env({**env, "PGWORKER_DURABLE_CLAIMS": "maybe"})
    assert (
        Settings.from_env({**env, "PGWORKER_DSN": "postgresql://db/y"}).dsn == "postgresql://db/y"
    )
    assert Settings.from_env(env, concurrency=2).concurrency == 2
    with pytest.raises(ConfigError, match="PGWORKER_DSN"):
        Settings.from_env({})
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**env, "PGWORKER_CONCURRENCY": "many"})
    assert info.value.field == "concurrency"
    for field, value in [
        ("concurrency", 0),
        ("poll_interval", -1),
        ("lease", 0),
        ("queues", ()),
        ("schema", "bad-name"),
        ("worker_id", ""),
        ("durable_claims", "yes"),
    ]:
        with pytest.raises(ConfigError) as info:
            Settings(dsn="postgresql://x", **{field: value})
        assert info.value.field == field
    with pytest.raises(AttributeError):
        s.concurrency = 3  # frozen


def test_every_public_name_is_importable():
    for name in [
        "Registry",
        "JobContext",
        "enqueue",
        "enqueue_many",
        "JobSpec",
        "get_job",
        "Worker",
        "RetryPolicy",
        "PermanentError",
        "Retry",
        "PgWorkerError",
        "IdempotencyConflict",
        "ValidationError",
        "ConfigError",
    ]:
        assert getattr(pgworker, name)
    for child in (pgworker.IdempotencyConflict, pgworker.ValidationError, pgworker.ConfigError):
        assert issubclass(child, pgworker.PgWorkerError)


def test_settings_queues_default_to_none_meaning_the_registrys_queues():
    assert Settings(dsn="postgresql://x").queues is None
    assert Settings(dsn="postgresql://x", queues=None).queues is None
    assert Settings(dsn="postgresql://x", queues=["a", "b"]).queues == ("a", "b")
    env = {"PGWORKER_DSN": "postgresql://x"}
    assert Settings.from_env(env).queues is None
    assert Settings.from_env({**env, "PGWORKER_QUEUES": " , "}).queues is None
    assert Settings.from_env({**env, "PGWORKER_QUEUES": "mail,default"}).queues == (
        "mail",
        "default",
    )
    with pytest.raises(ConfigError) as info:
        Settings.from_env({**env, "PGWORKER_QUEUES": "ok," + "q" * 64})
    assert info.value.field == "queues"


def test_settings_accept_their_bounds_and_timedeltas():
    s = Settings(
        dsn="postgresql://x",
        concurrency=validate.MAX_CONCURRENCY,
        poll_interval=timedelta(hours=1),
        shutdown_timeout=0,
        lease=timedelta(days=1),
        worker_id="w" * validate.MAX_WORKER_ID_LENGTH,
        queues=["q" * validate.MAX_QUEUE_LENGTH],
    )
    assert (s.poll_interval, s.shutdown_timeout, s.lease) == (3600.0, 0.0, 86400.0)
    with pytest.raises(ConfigError) as info:
        Settings(dsn="postgresql://x", poll_interval=3601)
    assert info.value.field == "poll_interval" and "at most 3,600 seconds (1 hour)" in str(
        info.value
    )


def test_retry_policy_takes_timedeltas_and_caps_its_delays():
    policy = RetryPolicy(initial_delay=timedelta(seconds=2), max_delay=validate.MAX_DELAY, jitter=1)
    assert policy.initial_delay == 2.0
    assert all(policy.delay(100, random.Random(n)) <= validate.MAX_DELAY for n in range(50))


def test_payload_size_limit_is_read_from_the_environment():
    out = subprocess.run(
        [sys.executable, "-c", "from pgworker import _validate as v; print(v.MAX_PAYLOAD_BYTES)"],
        capture_output=True,
        text=True,
        env={**os.environ, "PGWORKER_MAX_PAYLOAD_BYTES": "12345"},
        check=True,
    )
    assert out.stdout.strip() == "12345"


# --- schema names and their channels ---------------------------------------------------------


registry = pgworker.Registry()


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


@pytest.mark.asyncio(loop_scope="session")
async def test_a_schema_name_too_long_for_its_channels_is_refused_before_anything_is_written(
    dsn, conn
):
    """A schema name of 57 to 63 characters migrated, and then every enqueue raised asyncpg's
    "channel name too long" (its NOTIFY channels are named after it)."""
    for bad in ("s" * 57, "s" * 63):
        for call in (
            pgworker.migrate(conn, schema=bad),
            pgworker.enqueue(conn, "t", {}, schema=bad),
            pgworker.get_job(conn, 1, schema=bad),
        ):
            with pytest.raises(pgworker.ValidationError, match="schema") as info:
                await call
            assert "56" in str(info.value)
        with pytest.raises(pgworker.ConfigError, match="schema"):
            pgworker.Settings(dsn, schema=bad)
    assert not await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'sss%'")


@pytest.mark.asyncio(loop_scope="session")
async def test_the_longest_schema_name_serves_with_a_listener_that_hears_itself(
    dsn, conn, monkeypatch
):
    """At 56 characters every channel fits; the listener's ping channel, named after the schema,
    did not (from 46 characters): every health check failed and the listener reconnected for
    ever."""
    monkeypatch.setattr(_notifier, "CHECK_EVERY", 0.1)
    schema = "s" * 56
    await pgworker.migrate(conn, schema=schema)
    async with serving_guarded(registry, dsn, schema=schema, poll_interval=60) as worker:
        r = await pgworker.enqueue(conn, "plain", {"x": 1}, schema=schema)

        async def completed() -> bool:
            job = await pgworker.get_job(conn, r.job.id, schema=schema)
            return job is not None and job.status == "completed"

        await wait_for(completed)
        # The listener's health check (a ping to itself) went round, and no check failed.
        await wait_for(lambda: worker.health()["notifier"]["last_success"] is not None)
        assert worker.health()["notifier"]["last_error"] is None
