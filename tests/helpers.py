"""Bounded waits on conditions, and small readers of the tables."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent


def spawn_worker(
    module: str, dsn: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A real `pgworker run MODULE` process serving `dsn`, its output in `log`."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    environment.update(PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "pgworker", "run", module, *args, "--dsn", dsn],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=environment,
        cwd=ROOT,
    )


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
