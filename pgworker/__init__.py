"""pgworker: background jobs for asyncio services, on PostgreSQL."""

from __future__ import annotations

from typing import Any

from . import db
from .backoff import RetryPolicy
from .enqueue import DEFAULT_SCHEMA, enqueue, enqueue_many
from .errors import (
    ConfigError,
    DatabaseUnavailable,
    IdempotencyConflict,
    PermanentError,
    PgWorkerError,
    PrivilegeError,
    Retry,
    SchemaError,
    ValidationError,
)
from .executor import JobContext
from .models import (
    PRIORITY_LABELS,
    AttemptResult,
    EnqueueResult,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
)
from .registry import Registry, Task
from .settings import Settings
from .worker import Worker

__version__ = "0.1.0"


async def get_job(conn: db.Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> Job | None:
    """The job's current row (status, result, error, retry_count, progress), or None."""
    row = await db.get_job(conn, schema, job_id)
    return None if row is None else Job.from_record(row)


async def cancel(conn: db.Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> str:
    """Cancel a job. Returns what happened: "cancelled" (it was pending), "cancelling" (it is
    running: its worker stops it within about a second, its attempt closed as `cancelled`, never
    retried), or "completed"/"failed"/"cancelled" prefixed by "already " when it had finished.
    Raises ValidationError when there is no such job."""
    row = await db.cancel(conn, schema, job_id)
    if row is None:
        raise ValidationError("job_id", f"there is no job {job_id}")
    previous = row["previous"]
    if previous == "pending":
        return "cancelled"
    if previous == "running":
        return "cancelling"
    return f"already {previous}"


async def migrate(conn: Any, *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply pending migrations on an asyncpg Connection; returns the versions applied."""
    return await db.migrate(conn, schema)


__all__ = [
    "PRIORITY_LABELS",
    "AttemptResult",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "IdempotencyConflict",
    "Job",
    "JobContext",
    "JobSpec",
    "JobStatus",
    "Outcome",
    "PermanentError",
    "PgWorkerError",
    "PrivilegeError",
    "Registry",
    "Retry",
    "RetryPolicy",
    "SchemaError",
    "Settings",
    "Task",
    "ValidationError",
    "Worker",
    "__version__",
    "cancel",
    "enqueue",
    "enqueue_many",
    "get_job",
    "migrate",
]
