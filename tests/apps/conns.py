"""Handlers for the connection-count tests and bench (`pgworker run tests.apps.conns`).

`plain` reports a milestone and holds `payload["hold"]` seconds inside a plain step. `tx` does
the same, then holds `payload["tx_hold"]` seconds inside a transactional step, its transaction
open (and its connection borrowed) meanwhile."""

from typing import Any

import anyio

import pgworker

registry = pgworker.Registry()


async def _held(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    await ctx.progress("started")

    async def hold() -> int:
        await anyio.sleep(payload["hold"])
        return 1

    return int(await ctx.step("hold", hold))


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    return await _held(ctx, payload)


@registry.task("tx")
async def tx(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    held = await _held(ctx, payload)

    async def write(conn: Any) -> int:
        value = int(await conn.fetchval("SELECT 1"))
        await anyio.sleep(payload["tx_hold"])
        return value

    return held + int(await ctx.transactional_step("write", write))
