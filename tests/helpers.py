"""Bounded waits on conditions, and small readers of the tables."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import anyio


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    """Poll `predicate` (sync or async) until it returns a truthy value; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        await anyio.sleep(every)


async def statuses(conn: Any) -> dict[str, int]:
    rows = await conn.fetch("SELECT status, count(*) AS n FROM pgworker.jobs GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


async def all_finished(conn: Any) -> bool:
    return not await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
    )


async def attempts(conn: Any, job_id: int) -> list[Any]:
    return await conn.fetch(
        "SELECT * FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt", job_id
    )
