"""Handlers for the durable-step tests (`pgworker run tests.apps.steps`).

`tx-effect` reports a milestone, then writes its effect (a row of `step_effects`, which has no
unique key: only the step makes it happen once) in a transactional step. On its first attempt
it then writes the file `payload["barrier"]` and waits, its transaction still open, for the test
to SIGKILL the worker; on a later one it commits. Its result says what `ctx.last_progress` was."""

from typing import Any

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("tx-effect", retry=pgworker.RetryPolicy(max_retries=3, initial_delay=0.05))
async def tx_effect(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    last = ctx.last_progress
    await ctx.progress("started", {"attempt": ctx.attempt})

    async def effect(conn: Any) -> int:
        await conn.execute(
            "INSERT INTO step_effects (job_id, attempt) VALUES ($1, $2)", ctx.job_id, ctx.attempt
        )
        if ctx.attempt == 1:
            await anyio.Path(payload["barrier"]).write_text(str(ctx.job_id))
            await anyio.sleep(3600)  # SIGKILLed here, inside the step's transaction
        return ctx.attempt

    done_by = await ctx.transactional_step("effect", effect)
    return {"effect_by_attempt": done_by, "last_progress": last}
