"""Handlers served by `pgworker run tests.apps.waits` in test_wait.py."""

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("nap")
async def nap(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Sleeps `ms` milliseconds, then returns `n`."""
    await anyio.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n")}


@registry.task("boom", max_retries=0)
async def boom(ctx: pgworker.JobContext, payload: dict) -> None:
    raise pgworker.PermanentError("boom")
