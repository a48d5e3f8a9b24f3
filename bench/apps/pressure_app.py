"""The pressure harness's worker (bench/pressure/): `pgworker run bench.apps.pressure_app
--concurrency 32`. One task whose handler takes about a millisecond (an asyncio sleep, no CPU),
so that the worker's own claim and outcome work is what the machine spends its time on."""

from __future__ import annotations

import asyncio
import os

import pgworker

HANDLER_S = float(os.environ.get("BENCH_PRESSURE_HANDLER_MS", "1")) / 1000
"""How long a handler takes, from $BENCH_PRESSURE_HANDLER_MS (milliseconds, default 1)."""

registry = pgworker.Registry()


@registry.task("pressure")
async def pressure(ctx: pgworker.JobContext, payload: dict) -> None:
    await asyncio.sleep(HANDLER_S)
