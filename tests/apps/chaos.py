"""Handlers for the chaos tests (`pgworker run tests.apps.chaos`). CHAOS_DSN is where `effect`
records what it did: its effect in `chaos_effects` (keyed by job), and, when the payload asks for
`count_runs`, each run of its handler in `chaos_runs` (append-only, one row per run)."""

import os

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


@registry.task("refuse")
async def refuse(ctx: pgworker.JobContext, payload: dict) -> None:
    raise pgworker.PermanentError("refused")
