"""Cancel a job, and wait until a running one has stopped.

A pending job is `cancelled` at once. A running one is stopped by its worker (its handler is
cancelled, its attempt closed as `cancelled`, never retried) unless the handler finishes first.
A finished job is left as it is. `pgworker.cancel` raises pgworker.ValidationError when there is
no such job; the result is None when the job was deleted meanwhile. Bound the wait with
`anyio.fail_after` (or `asyncio.timeout`) around the call.
"""

from __future__ import annotations

import anyio
import asyncpg

import pgworker


async def cancel_and_wait(conn: asyncpg.Connection, job_id: int) -> pgworker.Job | None:
    outcome = await pgworker.cancel(conn, job_id)
    job = await pgworker.get_job(conn, job_id)
    # "cancelling": the job was running, and its worker was asked to stop it.
    while outcome == "cancelling" and job is not None and job.status == "running":
        await anyio.sleep(0.1)
        job = await pgworker.get_job(conn, job_id)
    return job
