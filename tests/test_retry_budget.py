"""Retries capped in time, and snoozes that spend none; a completed job keeps
no error of its earlier attempts (item 4)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker import RetryPolicy, Snooze
from pgworker.retry import next_retry, why_final

from .helpers import attempts, has_status, logged, serving_guarded, wait_for

aio = pytest.mark.asyncio(loop_scope="session")

SLOW = {"initial_delay": 600, "max_delay": 600, "jitter": 0}


# --- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, math.inf, "60", True, timedelta(-1)])
def test_a_bad_max_elapsed_is_a_config_error_naming_it(bad):
    with pytest.raises(pgworker.ConfigError) as raised:
        RetryPolicy(max_elapsed=bad)
    assert raised.value.field == "max_elapsed"


def test_max_elapsed_takes_seconds_or_a_timedelta_and_defaults_to_none():
    assert RetryPolicy().max_elapsed is None
    assert RetryPolicy(max_elapsed=timedelta(minutes=10)).max_elapsed == 600.0
    assert RetryPolicy(max_elapsed=0).max_elapsed == 0.0


def test_the_rule_ends_retries_once_the_budget_is_spent():
    policy = RetryPolicy(max_retries=5, max_elapsed=600, **SLOW)
    assert next_retry(policy, 0, None, elapsed=599.9) == 600
    assert next_retry(policy, 0, None, elapsed=600) is None
    assert next_retry(policy, 0, None, after=3, elapsed=601) is None
    assert next_retry(policy, 0, None) == 600  # no start known: no budget
    assert next_retry(RetryPolicy(**SLOW), 0, None, elapsed=1e9) == 600  # no budget set
    assert why_final(policy, 1, None) == " (retry budget of 600s spent)"
    assert why_final(policy, 5, None) == " (max_retries 5 exhausted)"


def test_snooze_takes_a_valid_delay():
    assert Snooze(timedelta(seconds=5)).after == 5.0
    assert str(Snooze(1.5)) == "snoozed for 1.5s"
    for bad in (-1, math.nan, math.inf, "5", None):
        with pytest.raises(pgworker.ValidationError) as raised:
            Snooze(bad)
        assert raised.value.field == "after"


# --- with a worker -----------------------------------------------------------------------------


async def spent_budget(conn, job_id: int, seconds: float) -> None:
    """Make the job's retry budget start `seconds` ago (the claim keeps a start it finds)."""
    await conn.execute(
        "UPDATE pgworker.jobs SET budget_started_at = now() - make_interval(secs => $2) "
        "WHERE id = $1",
        job_id,
        seconds,
    )


@aio
async def test_max_elapsed_ends_retries_with_retries_left(dsn, conn):
    registry = pgworker.Registry()
    policy = RetryPolicy(max_retries=100, max_elapsed=600, **SLOW)

    @registry.task("flaky", retry=policy)
    async def flaky(ctx, payload):
        if payload.get("retry"):
            raise pgworker.Retry(after=1, reason="busy")
        raise ValueError("remote down")

    over = (await pgworker.enqueue(conn, "flaky", {})).job.id
    asked = (await pgworker.enqueue(conn, "flaky", {"retry": True})).job.id
    within = (await pgworker.enqueue(conn, "flaky", {})).job.id
    for job_id in (over, asked):
        await spent_budget(conn, job_id, 601)
    await spent_budget(conn, within, 500)
    async with serving_guarded(registry, dsn):
        for job_id in (over, asked):
            await wait_for(lambda job_id=job_id: has_status(conn, job_id, "failed"))
        await wait_for(
            lambda: conn.fetchval("SELECT retry_count FROM pgworker.jobs WHERE id = $1", within)
        )
    spent = await pgworker.get_job(conn, over)
    assert spent.retry_count == 0
    assert spent.error == "ValueError: remote down (retry budget of 600s spent)"
    assert (await pgworker.get_job(conn, asked)).error == "Retry: busy (retry budget of 600s spent)"
    [row] = await attempts(conn, over)
    assert row["outcome"] == "failed"
    assert row["error_message"] == "remote down (retry budget of 600s spent)"
    kept = await pgworker.get_job(conn, within)
    assert (kept.status, kept.retry_count, kept.error) == ("pending", 1, "ValueError: remote down")


@aio
async def test_the_budget_runs_from_the_first_claim_across_retries(dsn, conn):
    """With time passing for real: retries stop after the budget, retries left or not; a job
    whose budget start was cleared (as a replay does) gets a fresh one at its next claim."""
    registry = pgworker.Registry()
    policy = RetryPolicy(max_retries=10_000, initial_delay=0.05, max_delay=0.05, max_elapsed=0.5)

    @registry.task("down", retry=policy)
    async def down(ctx, payload):
        raise ValueError("still down")

    job_id = (await pgworker.enqueue(conn, "down", {})).job.id
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, job_id, "failed"))
        job = await pgworker.get_job(conn, job_id)
        rows = await attempts(conn, job_id)
        assert len(rows) >= 2 and job.retry_count == len(rows) - 1 < 10_000
        assert job.budget_started_at == rows[0]["started_at"]
        assert rows[-1]["finished_at"] - rows[0]["started_at"] >= timedelta(seconds=0.5)
        assert [r["outcome"] for r in rows] == ["retried"] * (len(rows) - 1) + ["failed"]
        assert job.error == "ValueError: still down (retry budget of 0.5s spent)"
        await conn.execute(
            "UPDATE pgworker.jobs SET status = 'pending', retry_count = 0, error = NULL, "
            "budget_started_at = NULL, finished_at = NULL, run_at = now() WHERE id = $1",
            job_id,
        )
        await wait_for(lambda: has_status(conn, job_id, "failed"))
    again = await attempts(conn, job_id)
    assert len(again) >= len(rows) + 2  # retried again: a fresh budget
    assert (await pgworker.get_job(conn, job_id)).budget_started_at == again[len(rows)][
        "started_at"
    ]


@aio
async def test_snooze_moves_the_job_without_spending_a_retry(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("throttled", retry=RetryPolicy(max_retries=0, max_elapsed=0))
    async def throttled(ctx, payload):
        if ctx.attempt == 1:
            raise Snooze(timedelta(minutes=10))
        return "done"

    job_id = (await pgworker.enqueue(conn, "throttled", {})).job.id
    await spent_budget(conn, job_id, 3600)  # a snooze is no failure: the budget does not end it
    with capture_logs() as logs:
        async with serving_guarded(registry, dsn):
            before = datetime.now(UTC)
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT outcome = 'snoozed' FROM pgworker.job_attempts WHERE job_id = $1",
                    job_id,
                )
            )
            job = await pgworker.get_job(conn, job_id)
            assert (job.status, job.retry_count, job.error) == ("pending", 0, None)
            assert before + timedelta(seconds=590) < job.run_at < before + timedelta(seconds=610)
            await conn.execute("UPDATE pgworker.jobs SET run_at = now() WHERE id = $1", job_id)
            await wait_for(lambda: has_status(conn, job_id, "completed"))
    job = await pgworker.get_job(conn, job_id)
    assert (job.retry_count, job.result) == (0, "done")
    rows = await attempts(conn, job_id)
    assert [(r["outcome"], r["error_message"]) for r in rows] == [
        ("snoozed", None),
        ("completed", None),
    ]
    [line] = logged(logs, "job snoozed", job_id=job_id)
    assert line["status"] == "pending" and 599 < line["retry_in_s"] <= 600


@aio
async def test_a_snooze_with_a_bad_delay_fails_the_attempt(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("bad-snooze", max_retries=0)
    async def bad(ctx, payload):
        raise Snooze(-5)

    job_id = (await pgworker.enqueue(conn, "bad-snooze", {})).job.id
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, job_id, "failed"))
    job = await pgworker.get_job(conn, job_id)
    assert job.error.startswith("ValidationError: after: ")
    [row] = await attempts(conn, job_id)
    assert row["outcome"] == "failed" and "Snooze(-5)" in row["error_detail"]


@aio
async def test_a_completed_job_keeps_no_error_of_its_earlier_attempts(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("second-time", retry=RetryPolicy(initial_delay=0.01, max_delay=0.01))
    async def second_time(ctx, payload):
        if ctx.attempt == 1:
            raise ValueError("first try fails")
        return None

    job_id = (await pgworker.enqueue(conn, "second-time", {})).job.id
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, job_id, "completed"))
    job = await pgworker.get_job(conn, job_id)
    assert (job.retry_count, job.error) == (1, None)
    rows = await attempts(conn, job_id)
    assert [(r["outcome"], r["error_message"]) for r in rows] == [
        ("retried", "first try fails"),
        ("completed", None),
    ]
    assert "Traceback" in rows[0]["error_detail"] and rows[1]["error_detail"] is None


# --- max_retries beside a policy -------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_max_retries_beside_a_policy_keeps_its_retry_budget():
    """`task(max_retries=3, retry=RetryPolicy(max_retries=3, max_elapsed=60))` rebuilt the
    policy from four of its fields: the retry budget in time was dropped, silently."""
    registry = pgworker.Registry()
    policy = pgworker.RetryPolicy(max_retries=3, initial_delay=2, max_elapsed=60)

    @registry.task("budgeted", max_retries=3, retry=policy)
    async def handler(ctx: pgworker.JobContext, payload: Any) -> None:
        return None

    assert registry["budgeted"].retry == policy
