"""What operators and services do to jobs besides enqueueing them: read one, cancel one, and
create or upgrade the schema."""

from __future__ import annotations

import dataclasses
import json
from enum import StrEnum
from typing import Any

import asyncpg

from . import _limits as limits
from ._db import migrations
from ._db.connection import Executor
from ._db.queries import queries
from .errors import ValidationError
from .models import DEFAULT_SCHEMA, Job


class CancelResult(StrEnum):
    """What `cancel` did. A StrEnum: it compares equal to the strings earlier versions returned."""

    CANCELLED = "cancelled"
    """It was pending: it is cancelled now, and will never run."""
    CANCELLING = "cancelling"
    """It is running: its worker stops it within about a second, its attempt closed as
    `cancelled`, never retried."""
    ALREADY_COMPLETED = "already completed"
    ALREADY_FAILED = "already failed"
    ALREADY_CANCELLED = "already cancelled"


def _job_id(value: object) -> int:
    """A job id: an int that a bigint holds (a bool or a float is not one: `True` would read job
    1, `5.0` be rounded)."""
    return limits.count("job_id", value, minimum=1, maximum=limits.MAX_BIGINT)


async def get_job(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> Job | None:
    """The job's current row (status, result, error, retry_count, progress) with the results of
    the steps it has done (`Job.steps`, by name), or None."""
    q = queries(limits.identifier("schema", schema))
    row = await q.job_get(conn, _job_id(job_id))
    if row is None:
        return None
    steps = {s["name"]: _decoded(s["result"]) for s in await q.job_steps_of(conn, row["id"])}
    return dataclasses.replace(Job.from_record(row), steps=steps)


async def job_steps(
    conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """The steps the job has done, in the order they finished: dicts with `name`, `result`
    (decoded), `attempt`, `started_at` and `finished_at`. Empty for an unknown job."""
    q = queries(limits.identifier("schema", schema))
    return [
        {**dict(r), "result": _decoded(r["result"])}
        for r in await q.job_steps_of(conn, _job_id(job_id))
    ]


async def job_milestones(
    conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """Every milestone the job reported (`ctx.progress`), oldest first: dicts with `seq`,
    `attempt`, `milestone`, `detail` (decoded) and `at`. Empty for an unknown job."""
    q = queries(limits.identifier("schema", schema))
    return [
        {**dict(r), "detail": _decoded(r["detail"])}
        for r in await q.job_milestones_of(conn, _job_id(job_id))
    ]


def _decoded(text: str | None) -> Any:
    return None if text is None else json.loads(text)


async def cancel(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> CancelResult:
    """Cancel a job and say what happened (see CancelResult). Raises ValidationError when there
    is no such job."""
    q = queries(limits.identifier("schema", schema))
    row = await q.job_cancel(conn, _job_id(job_id))
    if row is None:
        raise ValidationError("job_id", f"there is no job {job_id}")
    previous = row["previous"]
    if previous == "pending":
        return CancelResult.CANCELLED
    if previous == "running":
        return CancelResult.CANCELLING
    return CancelResult(f"already {previous}")


async def migrate(conn: Executor, *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply pending migrations on an asyncpg Connection (or one of a pool's); returns the
    versions applied."""
    schema = limits.identifier("schema", schema)
    if isinstance(conn, asyncpg.Pool):
        # One connection throughout: the advisory lock is taken and released on the session
        # that applies the migrations.
        async with conn.acquire() as c:
            return await migrations.migrate(c, schema)
    return await migrations.migrate(conn, schema)


async def status(
    conn: Executor, *, schema: str = DEFAULT_SCHEMA, live_within: float = 60.0
) -> dict[str, list[Any]]:
    """What `pgworker status` shows: counts per queue and status, the oldest pending job per
    queue, queues no live worker serves, and the live workers."""
    q = queries(limits.identifier("schema", schema))
    live_within = limits.seconds("live_within", live_within, zero=False)
    return {
        "counts": await q.status_counts(conn),
        "oldest_pending": await q.status_oldest_pending(conn),
        "unserved": await q.status_unserved(conn, live_within),
        "workers": await q.status_workers(conn, live_within),
    }
