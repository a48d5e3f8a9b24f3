"""pgworker: background jobs for asyncio services, on PostgreSQL."""

from . import sync
from ._events import emit
from ._logs import configure_logging
from ._version import __version__
from ._waits import wait
from .context import JobContext
from .enqueue import enqueue, enqueue_many, update_job
from .errors import (
    ConfigError,
    DatabaseUnavailable,
    IdempotencyConflict,
    JobNotPending,
    PermanentError,
    PgWorkerError,
    PrivilegeError,
    Retry,
    SchemaError,
    Snooze,
    ValidationError,
)
from .models import PRIORITY_LABELS, EnqueueResult, Job, JobSpec, JobStatus
from .operations import (
    CancelResult,
    FailedJob,
    FailureGroup,
    PeriodicSchedule,
    QueueState,
    ReplayResult,
    cancel,
    failure_groups,
    get_job,
    limit_queue,
    list_failed,
    list_periodic,
    list_queues,
    migrate,
    pause_queue,
    prune,
    replay,
    resume_queue,
)
from .registry import Registry, Task, TaskHandle
from .retry import RetryPolicy
from .settings import Settings
from .worker import Worker

__all__ = [
    "PRIORITY_LABELS",
    "CancelResult",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "FailedJob",
    "FailureGroup",
    "IdempotencyConflict",
    "Job",
    "JobContext",
    "JobNotPending",
    "JobSpec",
    "JobStatus",
    "PeriodicSchedule",
    "PermanentError",
    "PgWorkerError",
    "PrivilegeError",
    "QueueState",
    "Registry",
    "ReplayResult",
    "Retry",
    "RetryPolicy",
    "SchemaError",
    "Settings",
    "Snooze",
    "Task",
    "TaskHandle",
    "ValidationError",
    "Worker",
    "__version__",
    "cancel",
    "configure_logging",
    "emit",
    "enqueue",
    "enqueue_many",
    "failure_groups",
    "get_job",
    "limit_queue",
    "list_failed",
    "list_periodic",
    "list_queues",
    "migrate",
    "pause_queue",
    "prune",
    "replay",
    "resume_queue",
    "sync",
    "update_job",
    "wait",
]
