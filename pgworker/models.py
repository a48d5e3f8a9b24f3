"""The shapes that travel along the data path: job rows, specs, and attempt outcomes."""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Literal, NamedTuple, TypedDict

from . import _validate as validate
from ._validate import PRIORITY_LABELS as PRIORITY_LABELS
from .errors import PgWorkerError, ValidationError


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


OptionKind = Literal[
    "text", "int", "priority", "time", "seconds", "ids", "choice", "states", "flag"
]
"""How a value of an option is read from text or JSON (the CLI's flags and the HTTP body's
fields are made from it): text, a whole number, an int or a priority label, an ISO 8601 time
with a time zone, seconds, job ids, one of `choices`, a list of job states, on or off."""


@dataclass(frozen=True, slots=True)
class Option:
    """One enqueue option, as every surface offers it (see EnqueueOptions). `check` is its
    validator: the value checked and made what is stored, or a ValidationError naming the option
    (on_parent_failure's also takes the parents checked, unique_states' the period: each means
    something only with the other). `help` says what it means and its default (that of
    `pgworker.enqueue`: a task's handle gives its task's queue, priority, version and unique
    defaults instead), naming other options in backticks, which each surface writes its own way
    (`--run-at` on the command line)."""

    kind: OptionKind
    help: str
    check: Callable[..., Any]
    default: Any = None
    max_length: int | None = None
    choices: tuple[str, ...] = ()
    name: str = ""
    """Filled in from EnqueueOptions."""


def _queue(value: Any) -> str:
    return validate.name("queue", value, validate.MAX_QUEUE_LENGTH, required=False) or DEFAULT_QUEUE


def _max_retries(value: Any) -> int | None:
    return None if value is None else validate.count("max_retries", value)


def _text(name: str, max_length: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return validate.name(name, value, max_length, required=False)

    return check


def _run_at(value: Any) -> datetime | None:
    return None if value is None else validate.run_at(value)


def _delay(value: Any) -> float | None:
    return None if value is None else validate.seconds("delay", value)


def _version(value: Any) -> int:
    return 1 if value is None else validate.count("version", value, minimum=1)


def _replace(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValidationError("replace", f"must be True or False, got {value!r}")
    return value


class EnqueueOptions(TypedDict, total=False):
    """The options of an enqueue, each declared once: its type, and as an Option its kind, help,
    validator and default. `enqueue`, `pgworker.sync.enqueue`, JobSpec, the task handles'
    `enqueue`, `run_job`, the CLI's `pgworker enqueue`, the HTTP API's `POST /jobs` and the SQL
    function `enqueue()` take these; tests/test_options.py fails when one of them differs (each
    exception listed there with its reason). A wrapper of `enqueue` can take them as
    `**options: Unpack[EnqueueOptions]`."""

    queue: Annotated[
        str | None,
        Option(
            "text",
            f"the job's queue, at most {validate.MAX_QUEUE_LENGTH} characters (default: default)",
            _queue,
            max_length=validate.MAX_QUEUE_LENGTH,
        ),
    ]
    priority: Annotated[
        int | str | None,
        Option(
            "priority",
            f"an int or one of {', '.join(PRIORITY_LABELS)} "
            f"({', '.join(str(v) for v in PRIORITY_LABELS.values())}); higher runs first "
            "(default: 0)",
            functools.partial(validate.priority, "priority"),
        ),
    ]
    max_retries: Annotated[
        int | None,
        Option(
            "int",
            "retries after the first attempt (default: the task's, else 3)",
            _max_retries,
        ),
    ]
    idempotency_key: Annotated[
        str | None,
        Option(
            "text",
            "a later enqueue with this key, the same type and the same payload returns this job "
            f"instead; at most {validate.MAX_IDEMPOTENCY_KEY_LENGTH} characters (default: none)",
            _text("idempotency_key", validate.MAX_IDEMPOTENCY_KEY_LENGTH),
            max_length=validate.MAX_IDEMPOTENCY_KEY_LENGTH,
        ),
    ]
    correlation_id: Annotated[
        str | None,
        Option(
            "text",
            "carried by the job's log lines and the jobs it enqueues, at most "
            f"{validate.MAX_CORRELATION_ID_LENGTH} characters (default: the running job's, else "
            "a new UUID)",
            _text("correlation_id", validate.MAX_CORRELATION_ID_LENGTH),
            max_length=validate.MAX_CORRELATION_ID_LENGTH,
        ),
    ]
    run_at: Annotated[
        datetime | None,
        Option(
            "time",
            "run no sooner than this ISO 8601 time with a timezone, e.g. "
            "2030-01-01T09:00:00+00:00; not with `delay` (default: now)",
            _run_at,
        ),
    ]
    delay: Annotated[
        timedelta | float | None,
        Option(
            "seconds",
            f"run no sooner than this many seconds from now, at most {validate.MAX_DELAY:,.0f} "
            "(ten years); not with `run_at` (default: now)",
            _delay,
        ),
    ]
    version: Annotated[
        int | None,
        Option(
            "int",
            "the payload's version: only workers whose task runs that version claim the job "
            "(default: 1)",
            _version,
        ),
    ]
    concurrency_key: Annotated[
        str | None,
        Option(
            "text",
            "the key the task's max_running_per_key counts running jobs by, at most "
            f"{validate.MAX_CONCURRENCY_KEY_LENGTH} characters (default: none)",
            validate.concurrency_key,
            max_length=validate.MAX_CONCURRENCY_KEY_LENGTH,
        ),
    ]
    after: Annotated[
        Sequence[int] | None,
        Option(
            "ids",
            "run only once each of these jobs (their ids) has ended, at most "
            f"{validate.MAX_PARENTS:,} of them; not with `delay` or `run_at` (default: none)",
            validate.parents,
        ),
    ]
    on_parent_failure: Annotated[
        str | None,
        Option(
            "choice",
            "with `after`: a parent that failed or was cancelled cancels this job (cancel) or "
            "lets it run (run) (default: cancel)",
            validate.on_parent_failure,
            choices=validate.PARENT_FAILURE_CHOICES,
        ),
    ]
    unique_key: Annotated[
        str | None,
        Option(
            "text",
            "while a job of this type and queue holding this key is in one of `unique_states`, "
            "return it (created false) instead of a new job; at most "
            f"{validate.MAX_UNIQUE_KEY_LENGTH} characters, not with `idempotency_key` "
            "(default: none)",
            validate.unique_key,
            max_length=validate.MAX_UNIQUE_KEY_LENGTH,
        ),
    ]
    unique_states: Annotated[
        Sequence[str] | None,
        Option(
            "states",
            "the states holding the key; both pending and running are required, a final state "
            "needs `unique_period` (default: pending,running)",
            validate.unique_states,
            choices=tuple(validate.UNIQUE_STATES),
        ),
    ]
    unique_period: Annotated[
        timedelta | float | None,
        Option(
            "seconds",
            "seconds: the key is held per period bucket of the enqueue time (default: none)",
            validate.unique_period,
        ),
    ]
    replace: Annotated[
        bool,
        Option(
            "flag",
            "with a pending job holding the key, give it this payload, priority and run time "
            "instead; refused while it runs (default: off)",
            _replace,
            default=False,
        ),
    ]


def _declared(options: type) -> dict[str, Option]:
    hints = typing.get_type_hints(options, include_extras=True)
    return {
        name: dataclasses.replace(hint.__metadata__[0], name=name) for name, hint in hints.items()
    }


ENQUEUE_OPTIONS: Mapping[str, Option] = MappingProxyType(_declared(EnqueueOptions))
"""EnqueueOptions' options by name, in their order."""


@dataclass(slots=True)
class JobSpec:
    """One job to enqueue with `enqueue_many`: its type, its payload and the options of an
    enqueue (EnqueueOptions, field for field). A plain dataclass, not a frozen one: batches build
    thousands, and a frozen one costs five times more to build (`enqueue_many` reads each spec
    once, when called)."""

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
