"""Pooler mode's pooled functions (`Queries.pooled_functions`) on the server itself, without a
pooler in between: made from the worker's statements and called in their stead, on every
PostgreSQL major of the matrix (a PL/pgSQL `RETURN QUERY` of a statement that writes)."""

from __future__ import annotations

import pytest

import pgworker
from pgworker._db.connection import create_pool
from pgworker._db.queries import POOLED, queries
from pgworker.models import AttemptResult, JobStatus, Outcome

from .helpers import count_function_calls, pooled_calls

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_pooled_functions_claim_finish_and_beat_as_the_statements_do(dsn, conn):
    q = queries("pgworker")
    await count_function_calls(conn)
    job = (await pgworker.enqueue(conn, "echo", {"n": 1})).job.id
    pool = await create_pool(dsn, size=2, lock_timeout=1.5, pooler=True, keyed=True)
    try:
        assert await q.pooled_functions(pool) == []
        made = await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE '\\_pooled\\_%'"
        )
        assert made == len(POOLED)
        async with pool.acquire() as c:
            rows = await q.job_claim(
                c,
                queues=["default"],
                types=["echo"],
                default_max_retries=[3],
                limit=5,
                worker_id="w",
                lease=30.0,
                code_version=None,
                most=lambda t: 5,
            )
            assert [r["id"] for r in rows] == [job]
            key = (job, rows[0]["attempts"], rows[0]["claimed_at"])
            beats = await q.worker_heartbeat(c, [key], 30.0)
            assert list(beats) == [(job, 1)]
            result = AttemptResult(
                job_id=job,
                attempt=1,
                status=JobStatus.COMPLETED,
                outcome=Outcome.COMPLETED,
                result="2",
                claimed_at=rows[0]["claimed_at"],
            )
            assert await q.job_finish_many(c, [result]) == {job: "completed"}
    finally:
        await pool.close()
    completed = await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_attempts WHERE job_id = $1 AND outcome = 'completed'",
        job,
    )
    assert completed == 1
    assert await conn.fetchval("SELECT result FROM pgworker.jobs WHERE id = $1", job) == "2"

    await pooled_calls(conn, "job_claim", "worker_heartbeat", "job_finish_many")
