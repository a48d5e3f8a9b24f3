"""The shapes that travel along the data path: job rows, specs, and attempt outcomes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from .errors import PgWorkerError


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Outcome(StrEnum):
    """How one attempt ended, as stored in `job_attempts.outcome`."""

    RUNNING = "running"
    COMPLETED = "completed"
    RETRIED = "retried"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    LOST = "lost"
    SNOOZED = "snoozed"
    WAITING = "waiting"
    """The handler waits for an event (ctx.wait_for_event): the job is pending until it comes."""


PRIORITY_LABELS: dict[str, int] = {"low": 0, "medium": 10, "high": 20, "critical": 30}

DEFAULT_QUEUE = "default"
DEFAULT_SCHEMA = "pgworker"
DEFAULT_MAX_RETRIES = 3


_UNSET: Any = object()


def _json(r: Any, column: str) -> Any:
    """A jsonb column, read as text, decoded; one Python cannot decode (nested deeper than its
    recursion allows: written around enqueue's checks) is a PgWorkerError naming the job."""
    text = r[column]
    if text is None:
        return None
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        raise PgWorkerError(
            f"{column}: the {column} of job {r['id']} cannot be decoded ({type(exc).__name__}: "
            f"{exc}); it was written around pgworker's checks: read it in SQL, then fix or "
            "delete the row"
        ) from None


@dataclass(frozen=True, slots=True)
class Job:
    """A row of `jobs`, as read at one moment."""

    id: int
    type: str
    queue: str
    payload: Any
    priority: int
    status: JobStatus
    retry_count: int
    max_retries: int | None
    attempts: int
    idempotency_key: str | None
    correlation_id: str
    run_at: datetime
    claimed_at: datetime | None
    worker_id: str | None
    lease_expires_at: datetime | None
    error: str | None
    progress: Any
    result: Any
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    version: int = 1
    """The payload's version (a task's `version=`)."""
    budget_started_at: datetime | None = None
    """When the retry budget in time started: the first claim, or the first after a replay."""
    traceparent: str | None = None
    """The W3C traceparent of the span active when the job was enqueued (see _tracing.py)."""
    scheduled_at: datetime | None = None
    """The slot a periodic job was enqueued for (`registry.periodic`); None for other jobs."""
    concurrency_key: str | None = None
    """The key whose per-key limit the job shares (`enqueue(..., concurrency_key=)`), or None."""
    parents: tuple[int, ...] | None = None
    """The ids of the jobs this one runs after (`enqueue(..., after=)`), ascending; None for a
    job enqueued without them."""
    parents_left: int | None = None
    """How many of `parents` had not ended when the row was read (0: released); None for a job
    without parents."""
    unique_key: str | None = None
    """The key the job is unique by (`enqueue(..., unique_key=)`), or None."""
    steps: dict[str, Any] | None = field(default=None, compare=False, metadata={"column": False})
    """The results of the steps the job has done, by name, as `get_job` read them (None when not
    read: a claim does not). Not a column of `jobs` (see `job_steps`), nor part of equality."""

    @classmethod
    def from_record(cls, r: Any, payload: Any = _UNSET) -> Job:
        """The job from a row holding its columns by name, the JSON ones as text (see
        `_db/files.job_columns`); `payload` when the caller already decoded it. Every field is
        read by its name: the dataclass is the one list of a job's columns."""
        values = {name: r[name] for name in JOB_FIELDS}
        for column in JSON_COLUMNS:
            values[column] = _json(r, column)
        values["status"] = JobStatus(values["status"])
        if values["run_at"].tzinfo is None:  # asyncpg's 'infinity', naive: parked
            values["run_at"] = PARKED
        if values["parents"] is not None:
            values["parents"] = tuple(values["parents"])
        if payload is not _UNSET:
            values["payload"] = payload
        return cls(**values)


PARKED = datetime.max.replace(tzinfo=UTC)
"""The run_at of a parked job ('infinity' in the database: it waits for its parents or for an
event), as a Job holds it."""

JOB_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Job) if f.metadata.get("column", True))
"""The columns of `jobs` a Job holds, in order (its fields but those marked not a column)."""
JSON_COLUMNS = frozenset({"payload", "progress", "result"})
"""The jsonb columns of `jobs`, read as text: pgworker decodes them itself, only when needed."""


@dataclass(slots=True)
class JobSpec:
    """One job to enqueue with `enqueue_many`; the fields mirror `enqueue`'s arguments. A plain
    dataclass, not a frozen one: batches build thousands, and a frozen one costs five times more
    to build (`enqueue_many` reads each spec once, when called)."""

    type: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int | str | None = None
    max_retries: int | None = None
    idempotency_key: str | None = None
    correlation_id: str | None = None
    run_at: datetime | None = None
    delay: timedelta | float | None = None
    version: int | None = None
    """The payload's version (a task's `version=`); None is 1."""
    concurrency_key: str | None = None
    """The key a task's `max_running_per_key` counts by (`enqueue(..., concurrency_key=)`)."""
    after: Sequence[int] | None = None
    """The ids of the jobs this one runs after (`enqueue(..., after=)`)."""
    on_parent_failure: str | None = None
    """"cancel" (the default) or "run": what a failed or cancelled parent does to this job."""
    unique_key: str | None = None
    """At most one live job per key, type and queue (`enqueue(..., unique_key=)`)."""
    unique_states: Sequence[str] | None = None
    """The states in which the key is held; None: pending and running."""
    unique_period: timedelta | float | None = None
    """Seconds: the key is held per period bucket of the enqueue time; None: no period."""
    replace: bool = False
    """With a pending job holding the key: give it this payload, priority and run_at."""


class EnqueueResult:
    """What an enqueue gave: the job, and whether this call created it (False: an earlier job
    holds the same idempotency key or unique key). `job` is built when first read: most callers
    never read it, and a batch of thousands then costs no objects that nobody looks at."""

    __slots__ = ("_args", "_created", "_job", "_make")

    def __init__(
        self,
        job: Job | None,
        created: bool,
        make: Callable[..., Job] | None = None,
        args: tuple[Any, ...] = (),
    ) -> None:
        self._job = job
        self._created = created
        self._make = make
        self._args = args

    @classmethod
    def later(cls, make: Callable[..., Job], *args: Any) -> EnqueueResult:
        """A created job that `make(*args)` builds when first read."""
        return cls(None, True, make, args)

    @property
    def created(self) -> bool:
        return self._created

    @property
    def job(self) -> Job:
        if self._job is None:
            assert self._make is not None
            self._job = self._make(*self._args)
            self._make, self._args = None, ()
        return self._job

    async def wait(
        self,
        conn: Any,
        timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the promised signature)
        *,
        schema: str = DEFAULT_SCHEMA,
    ) -> Job:
        """The job once it is completed, failed or cancelled: `pgworker.wait(conn, job.id,
        timeout)` (see there)."""
        assert wait_hook is not None  # set when pgworker is imported
        return await wait_hook(conn, self.job.id, timeout, schema=schema)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EnqueueResult):
            return NotImplemented
        return self.created == other.created and self.job == other.job

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EnqueueResult(job={self.job!r}, created={self.created!r})"


wait_hook: Callable[..., Awaitable[Job]] | None = None
"""`pgworker.wait`, set by pgworker/_waits.py when imported (pgworker's __init__ imports it):
EnqueueResult.wait calls it, from this module below it."""


class AttemptResult(NamedTuple):
    """What one attempt decided, computed by the executor and written by the completer.

    `job_id`, `attempt` and `claimed_at` name the attempt (its write is fenced by all three);
    `status` is the job's next status; `delay` (seconds) sets its next run_at when pending;
    `retried` is 1 when the attempt counts against max_retries; `correlation_id` is for the log
    lines about the outcome; `error_detail` the redacted traceback of a failed attempt (the
    error texts are redacted by the executor, see _redact.py). A named tuple: one is made per
    attempt, and a tuple costs a fraction of a frozen dataclass to build.
    """

    job_id: int
    attempt: int
    claimed_at: datetime
    status: JobStatus
    outcome: Outcome
    result: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    delay: float = 0.0
    retried: int = 0
    correlation_id: str | None = None
    error_detail: str | None = None
    run_ms: float | None = None
    """The run time: the handler's, in milliseconds (job_attempts.run_ms; the `run_ms` of the
    attempt's log line); for an HTTP worker, from its claim to its report; None: unknown."""
