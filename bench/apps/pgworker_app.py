"""pgworker handlers: `pgworker run bench.apps.pgworker_app --concurrency 10`."""

from __future__ import annotations

import pgworker

from .common import record_latency

registry = pgworker.Registry()


@registry.task("noop")
async def noop(ctx: pgworker.JobContext, payload: dict) -> None:
    return None


@registry.task("latency")
async def latency(ctx: pgworker.JobContext, payload: dict) -> None:
    record_latency(payload["t"])
