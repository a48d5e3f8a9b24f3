"""Handlers for `make scale` (tests/scale.py), served by `pgworker run tests.apps.scale` inside
each host's network namespace. `tick` waits 20 ms; `hold` waits longer than the lease, so that a
host cut off while running it shows whether it stops its attempts. Both return the attempt that
ran them: a late outcome written over a rescue would show as a result naming the wrong attempt.

SCALE_BREAK=rescue breaks a promise on purpose (the harness must then fail): the elected worker
finds expired leases but rescues none of them."""

import asyncio
import os
import time

import pgworker
from pgworker._maintenance.rescue import Rescue

registry = pgworker.Registry()
QUICK = pgworker.RetryPolicy(max_retries=5, initial_delay=0.2, max_delay=1.0, jitter=0.0)


@registry.task("tick", retry=QUICK)
async def tick(ctx: pgworker.JobContext, payload: dict) -> dict:
    await asyncio.sleep(0.02)
    return {"attempt": ctx.attempt}


@registry.task("hold", retry=QUICK)
async def hold(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Logs when its handler ends and how: the harness reads when a cut host stopped it."""
    started, how = time.monotonic(), "cancelled"
    try:
        await asyncio.sleep(payload["seconds"])
        how = "returned"
        return {"attempt": ctx.attempt}
    finally:
        ctx.log.info("scale: hold ended", how=how, ran=round(time.monotonic() - started, 3))


if os.environ.get("SCALE_BREAK") == "rescue":

    async def _rescue_nothing(self: object, decided: object) -> list[object]:
        return []

    Rescue._rescue = _rescue_nothing  # type: ignore[method-assign,assignment]
