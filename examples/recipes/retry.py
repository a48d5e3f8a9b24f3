"""Retry failed jobs: put them back to `pending`, their retries counted from zero again.

Their earlier attempts stay in `job_attempts`; the next attempt is numbered after them. The
statements name the default schema, `pgworker`; the channel that wakes the workers is the
schema's name followed by `_jobs`.
"""

from __future__ import annotations

import asyncpg

RETRY_JOB = """
UPDATE pgworker.jobs
SET status = 'pending', retry_count = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, updated_at = now()
WHERE id = $1 AND status = 'failed'
RETURNING queue
"""

REPLAY_FAILED = """
UPDATE pgworker.jobs
SET status = 'pending', retry_count = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, updated_at = now()
WHERE status = 'failed' AND type = $1
RETURNING queue
"""

WAKE = "SELECT pg_notify('pgworker_jobs', queue) FROM unnest($1::text[]) AS queue"


async def retry_job(conn: asyncpg.Connection, job_id: int) -> bool:
    """Run failed job `job_id` again; False when it is not `failed`."""
    async with conn.transaction():
        queue = await conn.fetchval(RETRY_JOB, job_id)
        if queue is None:
            return False
        await conn.execute(WAKE, [queue])  # a worker claims it now, not at its next poll
    return True


async def replay_failed(conn: asyncpg.Connection, job_type: str) -> int:
    """Run every failed job of `job_type` again; returns how many."""
    async with conn.transaction():
        queues = [r["queue"] for r in await conn.fetch(REPLAY_FAILED, job_type)]
        await conn.execute(WAKE, sorted(set(queues)))
    return len(queues)
