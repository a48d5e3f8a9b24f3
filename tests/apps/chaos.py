"""Handlers for the chaos tests (`pgworker run tests.apps.chaos`). CHAOS_DSN is where `effect`
records what it did: its effect in `chaos_effects` (keyed by job), and, when the payload asks for
`count_runs`, each run of its handler in `chaos_runs` (append-only, one row per run);
`step-effect` writes its effect through a transactional step. The `poison-*` handlers are the
soak's poison jobs."""

import asyncio
import os
import sys

import anyio
import asyncpg

import pgworker

registry = pgworker.Registry()


@registry.task("work", retry=pgworker.RetryPolicy(max_retries=10, initial_delay=0.05))
async def work(ctx: pgworker.JobContext, payload: dict) -> dict:
    """With `claim` in the payload, the result names the claim that ran it: an outcome written
    under a later claim of the same job shows as a result whose claim is not the job's."""
    await anyio.sleep(payload.get("ms", 0) / 1000)
    if payload.get("claim"):
        return {"n": payload.get("n"), "claimed_at": ctx.job.claimed_at.isoformat()}
    return {"n": payload.get("n")}


@registry.task("effect", max_retries=5)
async def effect(ctx: pgworker.JobContext, payload: dict) -> None:
    """The effect is keyed by the job: a second run finds it done and does not repeat it."""
    conn = await asyncpg.connect(os.environ["CHAOS_DSN"])
    try:
        if payload.get("count_runs"):
            await conn.execute(
                "INSERT INTO chaos_runs (job_id, attempt) VALUES ($1, $2)", ctx.job_id, ctx.attempt
            )
        await conn.execute(
            "INSERT INTO chaos_effects (job_id, attempt) VALUES ($1, $2)"
            " ON CONFLICT (job_id) DO NOTHING",
            ctx.job_id,
            ctx.attempt,
        )
    finally:
        await conn.close()
    if payload.get("hold") and ctx.attempt == 1:
        await anyio.sleep(3600)  # killed here: after the effect, before the acknowledgement


@registry.task("step-effect", max_retries=5)
async def step_effect(ctx: pgworker.JobContext, payload: dict) -> dict:
    """The effect written in a transactional step, into a table without a unique key: only the
    step's checkpoint (committed with it) keeps a second run from writing it again. Each run of
    the handler is a row of `chaos_runs`. The first attempt waits after the step, to be killed
    before its acknowledgement."""
    conn = await asyncpg.connect(os.environ["CHAOS_DSN"])
    try:
        await conn.execute(
            "INSERT INTO chaos_runs (job_id, attempt) VALUES ($1, $2)", ctx.job_id, ctx.attempt
        )
    finally:
        await conn.close()

    async def write(step: asyncpg.Connection) -> int:
        await step.execute(
            "INSERT INTO chaos_effects (job_id, attempt) VALUES ($1, $2)", ctx.job_id, ctx.attempt
        )
        return ctx.attempt

    done_by = await ctx.transactional_step("effect", write)
    if ctx.attempt == 1:
        await anyio.sleep(3600)  # killed here: after the step committed, before the ack
    return {"effect_by_attempt": done_by}


@registry.task("refuse")
async def refuse(ctx: pgworker.JobContext, payload: dict) -> None:
    raise pgworker.PermanentError("refused")


# --- poison jobs: handlers that return or raise what a careless or hostile handler might ---------
# Each ends in a documented state (`POISON` in tests/soak.py says which); none may stop a worker.
# The failing ones retry once, quickly: a lost attempt (its worker SIGKILLed) is retried, and the
# second attempt fails the same way.

POISON_RETRY = pgworker.RetryPolicy(max_retries=1, initial_delay=0.05)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@registry.task("poison-unprintable", retry=POISON_RETRY)
async def poison_unprintable(ctx: pgworker.JobContext, payload: dict) -> None:
    raise Unprintable()


@registry.task("poison-system-exit", retry=POISON_RETRY)
async def poison_system_exit(ctx: pgworker.JobContext, payload: dict) -> None:
    raise SystemExit(3)


@registry.task("poison-keyboard-interrupt", retry=POISON_RETRY)
async def poison_keyboard_interrupt(ctx: pgworker.JobContext, payload: dict) -> None:
    raise KeyboardInterrupt


@registry.task("poison-own-cancel", retry=POISON_RETRY)
async def poison_own_cancel(ctx: pgworker.JobContext, payload: dict) -> None:
    """Awaits a sub-task it cancelled itself: a CancelledError the worker did not cause."""
    sub = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    sub.cancel()
    await sub


@registry.task("poison-surrogate", retry=POISON_RETRY)
async def poison_surrogate(ctx: pgworker.JobContext, payload: dict) -> dict:
    """A lone surrogate in the result: stored with U+FFFD in its place."""
    return {"n": payload.get("n"), "text": "bad \udcff byte"}


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@registry.task("poison-deep", retry=POISON_RETRY)
async def poison_deep(ctx: pgworker.JobContext, payload: dict) -> list:
    """A result nested 5,000 deep: the job completes, the result is not stored (NULL)."""
    return _nested(5000)


@registry.task("poison-retry-far", retry=POISON_RETRY)
async def poison_retry_far(ctx: pgworker.JobContext, payload: dict) -> None:
    """`Retry(after=1e13)` raises ValidationError when constructed: the attempt's failure."""
    raise pgworker.Retry(after=1e13)


@registry.task("poison-sync-exit", retry=POISON_RETRY)
def poison_sync_exit(ctx: pgworker.JobContext, payload: dict) -> None:
    """A plain `def` handler calling sys.exit(1), in a worker thread: the handler's failure."""
    sys.exit(1)
