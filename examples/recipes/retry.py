"""Retry failed jobs on purpose: `pgworker.replay` puts them back to `pending` now, their retries
counted from zero again and the workers of their queues woken. Their earlier attempts stay in
`job_attempts`; the next attempt is numbered after them. Each replay is recorded in
`pgworker.job_events` with who did it and why."""

from __future__ import annotations

import asyncpg

import pgworker


async def retry_job(conn: asyncpg.Connection, job_id: int) -> bool:
    """Run failed (or cancelled) job `job_id` again; False when it is in another status."""
    result = await pgworker.replay(conn, [job_id], reason="retried from the recipe")
    return job_id in result.replayed


async def replay_failed(conn: asyncpg.Connection, job_type: str) -> int:
    """Run every failed job of `job_type` again; returns how many."""
    result = await pgworker.replay(conn, type=job_type, reason="replayed from the recipe")
    return len(result.replayed)
