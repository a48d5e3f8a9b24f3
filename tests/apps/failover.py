"""Handlers for `make failover` (tests/failover.py), served by `pgworker run tests.apps.failover`
on a multi-host DSN. `work` waits `ms` milliseconds and writes a line to the file FAILOVER_RUNS
as it starts and as it returns: the harness counts every run of a handler from that file, not
from the database, since a run whose claim the failover undid leaves no row behind.

FAILOVER_BREAK=rescue breaks a promise on purpose (the harness must then fail): the elected
worker finds expired leases but rescues none of them."""

import asyncio
import json
import os
import time

import pgworker
from pgworker._maintenance.rescue import Rescue

registry = pgworker.Registry()
QUICK = pgworker.RetryPolicy(max_retries=5, initial_delay=0.2, max_delay=1.0, jitter=0.0)


def _record(ctx: pgworker.JobContext, event: str) -> None:
    """One line, one write on a file opened for appending: the two workers' lines never mix."""
    claimed = ctx.job.claimed_at
    line = {
        "event": event,
        "job": ctx.job_id,
        "attempt": ctx.attempt,
        "claimed_at": claimed.isoformat() if claimed else None,
        "worker": ctx.worker_id,
        "pid": os.getpid(),
        "t": time.time(),
    }
    fd = os.open(os.environ["FAILOVER_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@registry.task("work", retry=QUICK)
async def work(ctx: pgworker.JobContext, payload: dict[str, int]) -> dict[str, int]:
    _record(ctx, "start")
    await asyncio.sleep(payload["ms"] / 1000)
    _record(ctx, "end")
    return {"attempt": ctx.attempt}


if os.environ.get("FAILOVER_BREAK") == "rescue":

    async def _rescue_nothing(self: object, decided: object) -> list[object]:
        return []

    Rescue._rescue = _rescue_nothing  # type: ignore[method-assign,assignment]
