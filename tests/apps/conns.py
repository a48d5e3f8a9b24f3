"""Handlers for the connection-count tests and bench (`pgworker run tests.apps.conns`).

`plain` reports a milestone and holds `payload["hold"]` seconds inside a plain step; `tx` does the
same inside a transactional step, its transaction open (and its connection borrowed) meanwhile."""

from typing import Any

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    await ctx.progress("started")

    async def hold() -> int:
        await anyio.sleep(payload["hold"])
        return 1

    return int(await ctx.step("hold", hold))


@registry.task("tx")
async def tx(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
    await ctx.progress("started")

    async def hold(conn: Any) -> int:
        value = int(await conn.fetchval("SELECT 1"))
        await anyio.sleep(payload["hold"])
        return value

    return int(await ctx.transactional_step("hold", hold))
