"""Handlers for `python -m bench.fleet`: `noop` returns at once (the fleet is bound by CPU),
`wait` waits its payload's `ms` (the fleet is bound by its slots until the CPU runs out)."""

from __future__ import annotations

import asyncio

import pgworker

registry = pgworker.Registry()


@registry.task("noop")
async def noop(ctx: pgworker.JobContext, payload: dict) -> None:
    return None


@registry.task("wait")
async def wait(ctx: pgworker.JobContext, payload: dict) -> None:
    await asyncio.sleep(payload["ms"] / 1000)
