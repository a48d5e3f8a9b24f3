"""What operators and services do to jobs besides enqueueing them: read one, cancel one, and
create or upgrade the schema."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from . import _limits as limits
from ._db import migrations
from ._db.connection import Conn, Executor
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


async def get_job(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> Job | None:
    """The job's current row (status, result, error, retry_count, progress), or None."""
    row = await queries(limits.identifier("schema", schema)).job_get(conn, job_id)
    return None if row is None else Job.from_record(row)


async def cancel(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> CancelResult:
    """Cancel a job and say what happened (see CancelResult). Raises ValidationError when there
    is no such job."""
    row = await queries(limits.identifier("schema", schema)).job_cancel(conn, job_id)
    if row is None:
        raise ValidationError("job_id", f"there is no job {job_id}")
    previous = row["previous"]
    if previous == "pending":
        return CancelResult.CANCELLED
    if previous == "running":
        return CancelResult.CANCELLING
    return CancelResult(f"already {previous}")


async def migrate(conn: Conn, *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply pending migrations on an asyncpg Connection; returns the versions applied."""
    return await migrations.migrate(conn, limits.identifier("schema", schema))


async def status(
    conn: Executor, *, schema: str = DEFAULT_SCHEMA, live_within: float = 60.0
) -> dict[str, list[Any]]:
    """What `pgworker status` shows: counts per queue and status, the oldest pending job per
    queue, queues no live worker serves, and the live workers."""
    q = queries(limits.identifier("schema", schema))
    return {
        "counts": await q.status_counts(conn),
        "oldest_pending": await q.status_oldest_pending(conn),
        "unserved": await q.status_unserved(conn, live_within),
        "workers": await q.status_workers(conn, live_within),
    }
