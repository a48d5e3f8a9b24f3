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
    "Registry",
    "Retry",
    "RetryPolicy",
    "SchemaError",
    "Settings",
    "Task",
    "ValidationError",
    "Worker",
    "__version__",
    "enqueue",
    "enqueue_many",
    "get_job",
    "migrate",
]
