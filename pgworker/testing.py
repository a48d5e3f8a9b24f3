"""Helpers for your own test suites: a pytest plugin with a migrated scratch database, assertions
on what was enqueued, `drain` to run due jobs inline through the worker's own claim, execution
and outcome code, `run_job` to run one handler with a real JobContext and no database, and
`advance` to let time pass for delayed jobs.

The plugin is opt-in, never registered by an entry point: `pytest_plugins = ["pgworker.testing"]`
in your root conftest.py, or `pytest -p pgworker.testing`. Importing this module needs pytest
and pgworker only; the async fixture is driven by pytest-asyncio when it is installed (any mode),
else by anyio's pytest plugin.

Time: the database's `now()` is the claim's clock, and it is not faked. `advance(conn, seconds)`
and `drain(..., until=...)` let time pass for the queue instead: they move every pending job's
`run_at` (and the start of its retry budget) that many seconds earlier, which makes due exactly
the jobs that would be due then, in the same order."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, Unpack, cast
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest
import structlog

from . import _validate as validate
from ._attempt import Attempt
from ._db.queries import AttemptKey, Queries, queries
from ._redact import DEFAULT_KEYS, redactor
from ._runtime.executor import execute
from ._steps.steps import MAX_NAME_LENGTH
from ._steps.store import StepStore
from .enqueue import _Fields, _fields, _payload
from .errors import PgWorkerError, ValidationError
from .models import (
    DEFAULT_QUEUE,
    DEFAULT_SCHEMA,
    JOB_FIELDS,
    AttemptResult,
    EnqueueOptions,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
)
from .operations import migrate
from .registry import Registry, Task, _with_defaults, served_key

__all__ = [
    "DrainError",
    "DrainResult",
    "DrainedAttempt",
    "JobRun",
    "advance",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued_jobs",
    "run_job",
]

WORKER_ID = "pgworker.testing"
"""The worker id that `drain` and `run_job` record (`jobs.worker_id`, `job_attempts`)."""
DSN_VARIABLE = "PGWORKER_TEST_DSN"
MAX_LISTED = 20
"""How many jobs an assertion's failure message lists."""

T = TypeVar("T")
Fixture = TypeVar("Fixture", bound=Callable[..., Any])


class DrainError(PgWorkerError):
    """`drain` ran `max_attempts` attempts and jobs were still due: a job that snoozes or
    retries without end, or handlers that keep enqueuing. Everything run so far is written."""


# --- what was enqueued ---------------------------------------------------------------------

_ANY: Any = object()
"""`payload` not given: any payload (None is the JSON null)."""


def _statuses(status: str | Iterable[str] | None) -> list[str] | None:
    if status is None:
        return None
    values = [status] if isinstance(status, str) else list(status)
    for value in values:
        try:
            JobStatus(value)
        except ValueError:
            known = ", ".join(s.value for s in JobStatus)
            raise ValidationError("status", f"{value!r} is not one of {known}") from None
    return values


def _json_text(field_name: str, value: Any) -> str:
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise ValidationError(
            field_name, f"must not nest lists and objects more than {validate.MAX_DEPTH} deep"
        ) from None
    except (TypeError, ValueError) as exc:
        raise ValidationError(field_name, f"must be JSON-serialisable ({exc})") from None
    problem = validate.json_problem(text, value)
    if problem is not None:
        raise ValidationError(field_name, problem)
    return text


def _names(field_name: str, values: Iterable[str], max_length: int) -> tuple[str, ...]:
    """A list of names, each checked; a lone string is refused (it would be read as a list of
    its characters: redact_keys="password" would redact "p", "a", ... and not "password")."""
    if isinstance(values, str | bytes):
        raise ValidationError(
            field_name, f"must be a list of names, got the string {values!r}; write [{values!r}]"
        )
    return tuple(validate.name(field_name, v, max_length) for v in values)


def _filters(
    type: str | None,
    payload: Any,
    payload_contains: Any,
    queue: str | None,
    status: str | Iterable[str] | None,
    priority: int | str | None,
    idempotency_key: str | None,
    correlation_id: str | None,
) -> dict[str, Any]:
    return {
        "type_": validate.name("type", type, validate.MAX_TYPE_LENGTH, required=False),
        "queue": validate.name("queue", queue, validate.MAX_QUEUE_LENGTH, required=False),
        "statuses": _statuses(status),
        # None is stored {} on every path (README, Enqueue): a job enqueued with None is {}.
        "payload": None
        if payload is _ANY
        else _json_text("payload", {} if payload is None else payload),
        "payload_contains": (
            None if payload_contains is None else _json_text("payload_contains", payload_contains)
        ),
        "idempotency_key": validate.name(
            "idempotency_key", idempotency_key, validate.MAX_IDEMPOTENCY_KEY_LENGTH, required=False
        ),
        "correlation_id": validate.name(
            "correlation_id", correlation_id, validate.MAX_CORRELATION_ID_LENGTH, required=False
        ),
        "priority": None if priority is None else validate.priority("priority", priority),
    }


async def enqueued_jobs(
    conn: Any,
    type: str | None = None,
    *,
    payload: Any = _ANY,
    payload_contains: Any = None,
    queue: str | None = None,
    status: str | Iterable[str] | None = None,
    priority: int | str | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[Job]:
    """The jobs matching every filter given, oldest first, whatever their status unless `status`
    (one status or several) says. `payload` matches a payload equal to it as JSON (key order does
    not matter; None matches `{}`, which is how a None payload is stored); `payload_contains`
    one that contains it (`{"a": 1}` matches `{"a": 1, "b": 2}`). `conn` is an asyncpg
    Connection or Pool."""
    found = await queries(schema).testing_jobs(
        conn,
        **_filters(
            type,
            payload,
            payload_contains,
            queue,
            status,
            priority,
            idempotency_key,
            correlation_id,
        ),
    )
    return [Job.from_record(r) for r in found]


def _wanted(**given: Any) -> str:
    shown = [
        f"{k}={v!r}"
        for k, v in given.items()
        if (v is not None or k == "payload") and v is not _ANY
    ]
    return ", ".join(shown) or "any job"


def _listing(jobs: list[Job]) -> str:
    """The jobs of a failure message, one a line, at most MAX_LISTED."""
    if not jobs:
        return "nothing was enqueued"
    lines = [f"enqueued ({len(jobs)}):"]
    for job in jobs[:MAX_LISTED]:
        payload = json.dumps(job.payload, ensure_ascii=False, default=repr)
        if len(payload) > 200:
            payload = payload[:199] + "…"
        extra = f" key={job.idempotency_key!r}" if job.idempotency_key else ""
        lines.append(
            f"  job {job.id} {job.type!r} {payload} status={job.status.value} "
            f"queue={job.queue!r} priority={job.priority}{extra}"
        )
    if len(jobs) > MAX_LISTED:
        lines.append(f"  … and {len(jobs) - MAX_LISTED} more")
    return "\n".join(lines)


async def assert_enqueued(
    conn: Any,
    type: str | None = None,
    *,
    payload: Any = _ANY,
    payload_contains: Any = None,
    queue: str | None = None,
    status: str | Iterable[str] | None = None,
    priority: int | str | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    count: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> Job:
    """Assert that a job matching the filters (those of `enqueued_jobs`) exists, exactly `count`
    of them when given, and return the oldest. Otherwise an AssertionError says what was looked
    for and lists what was enqueued."""
    given = dict(
        type=type,
        payload=payload,
        payload_contains=payload_contains,
        queue=queue,
        status=status,
        priority=priority,
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
    )
    found = await enqueued_jobs(conn, **given, schema=schema)
    if found and (count is None or len(found) == count):
        return found[0]
    everything = await enqueued_jobs(conn, schema=schema)
    wanted = _wanted(**given)
    if not found:
        raise AssertionError(f"no job enqueued matching {wanted}; {_listing(everything)}")
    raise AssertionError(
        f"expected {count} job(s) matching {wanted}, found {len(found)} "
        f"(ids {[j.id for j in found]}); {_listing(everything)}"
    )


async def assert_not_enqueued(
    conn: Any,
    type: str | None = None,
    *,
    payload: Any = _ANY,
    payload_contains: Any = None,
    queue: str | None = None,
    status: str | Iterable[str] | None = None,
    priority: int | str | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> None:
    """Assert that no job matches the filters (those of `enqueued_jobs`); otherwise an
    AssertionError lists the jobs that do."""
    given = dict(
        type=type,
        payload=payload,
        payload_contains=payload_contains,
        queue=queue,
        status=status,
        priority=priority,
        idempotency_key=idempotency_key,
        correlation_id=correlation_id,
    )
    found = await enqueued_jobs(conn, **given, schema=schema)
    if found:
        raise AssertionError(
            f"expected no job matching {_wanted(**given)}, found {len(found)}; {_listing(found)}"
        )


# --- time ----------------------------------------------------------------------------------


def _seconds(field_name: str, value: timedelta | float | datetime) -> float:
    """A span of time as seconds >= 0; an aware datetime is the span from now until it."""
    if isinstance(value, datetime):
        moment = validate.moment(field_name, value)
        return max((moment - datetime.now(UTC)).total_seconds(), 0.0)
    return validate.seconds(field_name, value)


async def advance(
    conn: Any, by: timedelta | float | datetime, *, schema: str = DEFAULT_SCHEMA
) -> int:
    """Let `by` (seconds, a timedelta, or up to an aware datetime) pass for the pending jobs:
    each one's `run_at` (and the start of its retry budget) moves that much earlier, so that the
    jobs due by then are due now, in the same order. The database's clock is left alone. Returns
    how many jobs moved."""
    return await queries(schema).testing_advance(conn, _seconds("by", by))


# --- drain: due jobs run inline, as a worker runs them ------------------------------------


@dataclass(frozen=True, slots=True)
class DrainedAttempt:
    """One attempt that `drain` ran: the job's next status and the attempt's outcome, as
    written to `jobs` and `job_attempts`."""

    job_id: int
    type: str
    attempt: int
    outcome: str
    status: str
    error: str | None


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a `drain` ran, in order; `advanced` is the time it let pass (seconds)."""

    attempts: tuple[DrainedAttempt, ...] = ()
    advanced: float = 0.0

    def __len__(self) -> int:
        return len(self.attempts)

    def outcomes(self, job_id: int | None = None) -> list[str]:
        """The outcomes in order (of one job's attempts when `job_id` is given)."""
        return [a.outcome for a in self.attempts if job_id is None or a.job_id == job_id]

    @property
    def completed(self) -> list[int]:
        """The ids of the jobs completed."""
        return [a.job_id for a in self.attempts if a.status == JobStatus.COMPLETED]

    @property
    def failed(self) -> list[int]:
        """The ids of the jobs that failed for good."""
        return [a.job_id for a in self.attempts if a.status == JobStatus.FAILED]


class _OneConnection:
    """One connection seen as a pool, for the steps of the attempts `drain` runs: they read and
    write on the caller's connection, one statement at a time (a handler's tasks may run steps
    at once)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        async with self._lock:
            yield self._conn

    async def fetch(self, *args: Any) -> Any:
        async with self._lock:
            return await self._conn.fetch(*args)

    async def fetchrow(self, *args: Any) -> Any:
        async with self._lock:
            return await self._conn.fetchrow(*args)

    async def fetchval(self, *args: Any) -> Any:
        async with self._lock:
            return await self._conn.fetchval(*args)


class _LentSteps(StepStore):
    """A StepStore on a connection lent by the caller (opened and closed by the caller)."""

    def __init__(self, pool: Any, schema: str) -> None:
        super().__init__("", schema, 1, WORKER_ID)
        self._lent = pool

    async def pool(self) -> asyncpg.Pool:
        return cast(asyncpg.Pool, self._lent)

    async def close(self) -> None:
        return None


def _error_of(result: AttemptResult) -> str | None:
    """The error as `jobs.error` stores it (see job_finish_many.sql)."""
    if result.error_type is None:
        return None
    if not result.error_message:
        return result.error_type
    return f"{result.error_type}: {result.error_message}"


async def _drain(
    conn: Any,
    registry: Registry,
    queues: tuple[str, ...],
    horizon: float,
    max_attempts: int,
    schema: str,
    redact_keys: tuple[str, ...],
) -> DrainResult:
    q = queries(schema)
    served = registry.served()
    version_1_types = [t for t, v in served if v == 1]
    other_versions = [served_key(t, v) for t, v in served if v != 1]
    types = [t.name for t in registry]
    default_max_retries = [t.retry.max_retries for t in registry]
    store = _LentSteps(_OneConnection(conn), schema)
    redact = redactor(redact_keys)
    ran: list[DrainedAttempt] = []
    advanced = 0.0
    while True:
        records = await q.job_claim(
            conn,
            queues=queues,
            types=types,
            default_max_retries=default_max_retries,
            limit=1,
            worker_id=WORKER_ID,
            lease=3600.0,
            code_version=None,
            durable=True,  # the claim keeps the caller's synchronous_commit
            version_1_types=version_1_types,
            other_versions=other_versions,
            limited_queues=True,  # one job at a time: no limit can be exceeded
        )
        if not records:
            due = await q.testing_next_due(conn, queues, version_1_types, other_versions)
            if due is None or due <= 0 or advanced + due > horizon:
                # Nothing more within the horizon (or due but held by another session).
                break
            await q.testing_advance(conn, due)
            advanced += due
            continue
        attempt = Attempt(records[0], store)
        if len(ran) >= max_attempts:
            await _hand_back(conn, q, attempt)
            raise DrainError(_too_many(ran, max_attempts))
        try:
            with structlog.contextvars.bound_contextvars(**attempt.keys):
                result = await execute(attempt, registry[attempt.type], WORKER_ID, redact)
        except BaseException:  # the test was cancelled (its timeout) while the handler ran
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await _hand_back(conn, q, attempt)
            raise
        if attempt.task_cancelled:
            # The handler saw the test's own cancellation (asyncio.timeout, task.cancel()): the
            # executor handed the job back, and the cancellation goes on to the test.
            with anyio.CancelScope(shield=True):
                await q.job_finish_many(conn, [result])
            raise asyncio.CancelledError
        await q.job_finish_many(conn, [result])
        ran.append(
            DrainedAttempt(
                attempt.id,
                attempt.type,
                attempt.number,
                result.outcome.value,
                result.status.value,
                _error_of(result),
            )
        )
    rest = horizon - advanced
    if rest > 0:
        await q.testing_advance(conn, rest)
        advanced = horizon
    return DrainResult(tuple(ran), advanced)


async def _hand_back(conn: Any, q: Queries, attempt: Attempt) -> None:
    """A claimed attempt that `drain` will not run (to its end): back to pending, uncounted."""
    await q.job_finish_many(conn, [attempt.ends(JobStatus.PENDING, Outcome.INTERRUPTED)])


def _too_many(ran: list[DrainedAttempt], max_attempts: int) -> str:
    counts = Counter((a.job_id, a.type) for a in ran)
    last = {a.job_id: a.outcome for a in ran}
    busiest = ", ".join(
        f"job {job_id} ({type_!r}): {n} attempt{'' if n == 1 else 's'}, the last {last[job_id]}"
        for (job_id, type_), n in counts.most_common(3)
    )
    return (
        f"drain ran max_attempts={max_attempts} attempts and jobs are still due; ran most: "
        f"{busiest}. A job that snoozes or retries without end (or handlers that keep "
        "enqueuing) never drains: bound it in the handler, or pass a larger max_attempts"
    )


async def drain(
    conn: Any,
    registry: Registry,
    *,
    queues: Iterable[str] | None = None,
    until: timedelta | float | datetime | None = None,
    max_attempts: int = 1000,
    schema: str = DEFAULT_SCHEMA,
    redact_keys: Iterable[str] = DEFAULT_KEYS,
) -> DrainResult:
    """Run the due jobs of `registry`'s types one at a time, in claim order, until none is
    left, through a worker's own code: the claim (`Queries.job_claim`), the executor's attempt (the
    handler under its task's timeout, retries, `Retry`, `Snooze`, `PermanentError`, steps and
    milestones) and the outcome's write (`job_finish_many.sql`), on `conn` (an asyncpg
    Connection, or a Pool: one of its connections). Jobs that become due meanwhile (a retry
    without delay, a job a handler enqueued) run too. Jobs of other types stay pending.

    `until` (seconds, a timedelta, or an aware datetime) lets that much time pass: each job due
    before then runs when its time comes, in order (the pending jobs' `run_at` move earlier, see
    `advance`; retries back off as in a worker), and at the end the whole span has passed.
    `queues` defaults to a worker's: every queue the registry names, plus `default`.

    Bounded: after `max_attempts` attempts with jobs still due, it stops with a DrainError
    naming the jobs that ran most (everything run until then is written). Returns what ran."""
    count = validate.count("max_attempts", max_attempts, minimum=1)
    if not isinstance(registry, Registry):
        raise ValidationError("registry", f"must be a pgworker.Registry, got {registry!r}")
    served = (
        _names("queues", queues, validate.MAX_QUEUE_LENGTH)
        if queues is not None
        else (*registry.queues(), DEFAULT_QUEUE)
    )
    served = tuple(dict.fromkeys(served))
    horizon = 0.0 if until is None else _seconds("until", until)
    keys = _names("redact_keys", redact_keys, validate.MAX_QUEUE_LENGTH)
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as held:
            return await _drain(held, registry, served, horizon, count, schema, keys)
    return await _drain(conn, registry, served, horizon, count, schema, keys)


# --- run_job: one handler, a real JobContext, no database ---------------------------------


@dataclass(frozen=True, slots=True)
class JobRun:
    """How one attempt run by `run_job` ended, as a worker would write it.

    `status` is the job's next status and `outcome` the attempt's (`completed`, `retried`,
    `failed`, `snoozed`, `timed_out`); `result` the return value as it would be stored (decoded
    back from JSON; None when it cannot be stored); `error` the text `jobs.error` would hold and
    `traceback` the redacted traceback; `delay` the seconds before the job would run again
    (pending only); `steps` every step's stored result by name (those given to `run_job` and those
    this attempt ran), `ran_steps` the names this attempt ran; `milestones` every milestone this
    attempt reported (`{"milestone", "detail", "at", "attempt"}`), `progress` the last one."""

    status: str
    outcome: str
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    delay: float | None = None
    steps: dict[str, Any] = field(default_factory=dict)
    ran_steps: list[str] = field(default_factory=list)
    milestones: list[dict[str, Any]] = field(default_factory=list)
    progress: dict[str, Any] | None = None


class _MemoryQueries:
    """The statements steps and milestones use, kept in memory (see _steps.py); a transactional
    step's transaction id is read on the connection its function runs on."""

    def __init__(self, done: Mapping[str, str], attempt: int) -> None:
        self.done = dict(done)
        self.ran: list[str] = []
        self.milestones: list[dict[str, Any]] = []
        self._attempt = attempt

    async def job_steps_done(self, conn: Any, key: AttemptKey) -> tuple[bool, dict[str, str]]:
        return True, dict(self.done)

    async def job_parents_of(self, conn: Any, ids: list[int]) -> list[Any]:
        """No parent is found (there is no database): `ctx.parents` is empty, as when every
        parent of the job was pruned."""
        return []

    async def step_transaction(self, conn: Any) -> int:
        return await queries(DEFAULT_SCHEMA).step_transaction(conn)

    async def job_step_record(
        self,
        conn: Any,
        key: AttemptKey,
        name: str,
        result: str,
        started_at: Any,
        transaction: int | None = None,
    ) -> tuple[bool, str | None]:
        if transaction is not None and await self.step_transaction(conn) != transaction:
            return False, None
        if name not in self.done:
            self.done[name] = result
            self.ran.append(name)
        return True, self.done[name]

    async def job_progress(
        self, conn: Any, key: AttemptKey, milestone: str, detail: str | None
    ) -> bool:
        self.milestones.append(
            {
                "milestone": milestone,
                "detail": None if detail is None else json.loads(detail),
                "at": datetime.now(UTC).isoformat(),
                "attempt": self._attempt,
            }
        )
        return True


class _NoDatabase:
    """What a transactional step gets from `run_job` without `conn`."""

    def acquire(self) -> Any:
        raise PgWorkerError(
            "ctx.transactional_step needs a database connection: run_job runs without one "
            "unless given run_job(..., conn=an asyncpg connection), on which the step's "
            "function then runs in a transaction"
        )


class _MemorySteps(StepStore):
    def __init__(self, memory: _MemoryQueries, conn: Any) -> None:
        super().__init__("", DEFAULT_SCHEMA, 1, WORKER_ID)
        self.q = cast(Queries, memory)
        self._lent = _NoDatabase() if conn is None else _OneConnection(conn)

    async def pool(self) -> asyncpg.Pool:
        return cast(asyncpg.Pool, self._lent)

    async def close(self) -> None:
        return None


def _task(registry: Registry, type: str) -> Task:
    if not isinstance(registry, Registry):
        raise ValidationError("registry", f"must be a pgworker.Registry, got {registry!r}")
    if type not in registry:
        known = ", ".join(repr(t.name) for t in registry) or "none"
        raise ValidationError("type", f"{type!r} is not a task of this registry (tasks: {known})")
    return registry[type]


def _record(
    task: Task,
    payload_text: str,
    enqueued: _Fields,
    *,
    job_id: int,
    attempt: int,
    retry_count: int,
    max_retries: int,
    correlation_id: str,
    version: int,
    progress: str | None,
    scheduled_at: datetime | None = None,
) -> dict[str, Any]:
    """A claimed row of `jobs`, as job_claim.sql returns it (JSON columns as text), with the
    fields `enqueued` gives."""
    now = datetime.now(UTC)
    run_at = enqueued.run_at or now + timedelta(seconds=enqueued.delay or 0)
    row: dict[str, Any] = {
        "id": job_id,
        "type": task.name,
        "queue": enqueued.queue,
        "payload": payload_text,
        "priority": enqueued.priority,
        "status": JobStatus.RUNNING.value,
        "retry_count": retry_count,
        "max_retries": max_retries,
        "attempts": attempt,
        "idempotency_key": enqueued.idempotency_key,
        "correlation_id": correlation_id,
        "run_at": run_at,
        "claimed_at": now,
        "worker_id": WORKER_ID,
        "lease_expires_at": now + timedelta(hours=1),
        "error": None,
        "progress": progress,
        "result": None,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "version": version,
        "budget_started_at": now,
        "traceparent": None,
        "scheduled_at": scheduled_at,
        "concurrency_key": enqueued.concurrency_key,
        "parents": None if enqueued.after is None else list(enqueued.after),
        "parents_left": None if enqueued.after is None else 0,
        "unique_key": enqueued.unique_key,
    }
    missing = set(JOB_FIELDS) - set(row)
    assert not missing, f"run_job does not fill the columns {sorted(missing)}"
    return row


class RunJobOptions(EnqueueOptions, total=False):
    """What `run_job` takes: the options of an enqueue (EnqueueOptions: the job's fields, as a
    worker would claim it), and those of the attempt (see `_run_job`)."""

    attempt: int
    retry_count: int | None
    job_id: int
    steps: Mapping[str, Any] | None
    last_progress: Mapping[str, Any] | None
    scheduled_at: datetime | None
    conn: Any
    redact_keys: Iterable[str]


def run_job(
    registry: Registry, type: str, payload: Any = None, **options: Unpack[RunJobOptions]
) -> Any:
    """Run one attempt of the handler of `type` on `payload` (default `{}`) as a worker would, with
    a real JobContext and no database, and give its JobRun. In async code it is awaited
    (`run = await run_job(registry, "send-invoice", {"invoice_id": 42})`); called where no event
    loop runs (a plain `def` test), it runs the attempt in a loop of its own and returns the JobRun.

    Options: every option of an enqueue (`queue`, `priority`, `max_retries`, `correlation_id`,
    `version`, `concurrency_key`, `after`, ...: RunJobOptions), and `attempt`, `retry_count`,
    `job_id`, `steps`, `last_progress`, `scheduled_at`, `conn`, `redact_keys` (see
    `_run_job`)."""
    call = _run_job(registry, type, payload, **options)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(call)
    return call


async def _run_job(
    registry: Registry,
    type: str,
    payload: Any = None,
    *,
    attempt: int = 1,
    retry_count: int | None = None,
    job_id: int = 1,
    steps: Mapping[str, Any] | None = None,
    last_progress: Mapping[str, Any] | None = None,
    scheduled_at: datetime | None = None,
    conn: Any = None,
    redact_keys: Iterable[str] = DEFAULT_KEYS,
    **options: Unpack[EnqueueOptions],
) -> JobRun:
    """Run one attempt of the handler of `type` on `payload` (default `{}`) as a worker would:
    a real JobContext, the task's timeout, upgraders and retry rule, the same outcome and error
    texts, and no database. `ctx.step` and `ctx.progress` record in memory: `steps` seeds the
    results of steps done by earlier attempts (not run again), `last_progress` the milestone
    `ctx.last_progress` returns. `ctx.transactional_step` needs `conn` (an asyncpg connection),
    on which its function runs in a transaction. `attempt` is the attempt's number (1: the first),
    `retry_count` the retries spent before it (default `attempt - 1`), `max_retries` the job's
    (default the task's), `version` the payload's (default the task's), `scheduled_at` the slot
    of a periodic job (`ctx.scheduled_at`; timezone-aware, default None). The enqueue
    options are checked as `TaskHandle.enqueue` checks them (the task's defaults where none is
    given) and make the job's fields (`ctx.job.queue`, `.concurrency_key`, `.parents`, ...;
    `run_at` or `delay` its run_at); `on_parent_failure`, `unique_states`, `unique_period` and
    `replace` decide what an enqueue writes, not what an attempt does: checked only."""
    task = _task(registry, type)
    text = _payload(None, {} if payload is None else payload)
    enqueued = _fields(JobSpec(type, None, **_with_defaults(task, options)), None)
    number = validate.count("attempt", attempt, minimum=1)
    retried = attempt - 1 if retry_count is None else validate.count("retry_count", retry_count)
    allowed = task.retry.max_retries if enqueued.max_retries is None else enqueued.max_retries
    given_version = enqueued.version
    if given_version not in task.versions:
        raise ValidationError(
            "version",
            f"task {type!r} runs payload versions {task.versions.start} to {task.version} "
            f"(its own and those its upgraders lead from), not {given_version}",
        )
    done = {
        validate.name("steps", name, MAX_NAME_LENGTH): _json_text(f"steps[{name!r}]", value)
        for name, value in (steps or {}).items()
    }
    progress = None if last_progress is None else _json_text("last_progress", dict(last_progress))
    memory = _MemoryQueries(done, number)
    record = _record(
        task,
        text,
        enqueued,
        job_id=validate.count("job_id", job_id, minimum=1),
        attempt=number,
        retry_count=retried,
        max_retries=allowed,
        correlation_id=enqueued.correlation_id or str(uuid.uuid4()),
        version=given_version,
        progress=progress,
        scheduled_at=None
        if scheduled_at is None
        else validate.moment("scheduled_at", scheduled_at),
    )
    running = Attempt(record, _MemorySteps(memory, conn))
    with structlog.contextvars.bound_contextvars(**running.keys):
        keys = _names("redact_keys", redact_keys, validate.MAX_QUEUE_LENGTH)
        result = await execute(running, task, WORKER_ID, redactor(keys))
    if running.task_cancelled:  # the test's own cancellation: it goes on to the test
        raise asyncio.CancelledError
    return JobRun(
        status=result.status.value,
        outcome=result.outcome.value,
        result=None if result.result is None else json.loads(result.result),
        error=_error_of(result),
        traceback=result.error_detail,
        delay=result.delay if result.status is JobStatus.PENDING else None,
        steps={name: json.loads(value) for name, value in memory.done.items()},
        ran_steps=list(memory.ran),
        milestones=list(memory.milestones),
        progress=memory.milestones[-1] if memory.milestones else _decoded(progress),
    )


def _decoded(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- the pytest plugin ---------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgworker", "pgworker.testing")
    group.addoption(
        "--pgworker-dsn",
        dest="pgworker_dsn",
        default=None,
        help=f"PostgreSQL server on which to create the scratch database of the pgworker "
        f"fixtures (default: ${DSN_VARIABLE})",
    )


def _in_a_thread(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end on an event loop of its own, in a thread: a sync fixture may
    be set up while the test session's loop exists (or runs)."""

    async def main() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def _create_database(server: str, database: str) -> str:
    admin = await asyncpg.connect(server)
    try:
        try:
            await queries(DEFAULT_SCHEMA).testing_database_create(admin, database)
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise PgWorkerError(
                f"pgworker.testing: cannot create the scratch database ({exc}); the DSN's role "
                "needs CREATEDB (ALTER ROLE ... CREATEDB)"
            ) from None
    finally:
        await admin.close()
    dsn = _with_database(server, database)
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return dsn


async def _drop_database(server: str, database: str) -> None:
    admin = await asyncpg.connect(server)
    try:
        await queries(DEFAULT_SCHEMA).testing_database_drop(admin, database)
    finally:
        await admin.close()


async def _reset(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, server_settings={"lock_timeout": "10s"})
    try:
        try:
            await queries(DEFAULT_SCHEMA).testing_reset(conn)
        except asyncpg.exceptions.LockNotAvailableError:
            raise PgWorkerError(
                "pgworker.testing: cannot empty the pgworker tables between tests: a connection "
                "that an earlier test left open holds a lock on them (close connections, and "
                "stop workers, before a test ends)"
            ) from None
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pgworker_database(request: pytest.FixtureRequest) -> Iterator[str]:
    """The DSN of this session's scratch database: created on the server of `--pgworker-dsn`
    (else $PGWORKER_TEST_DSN), migrated once, dropped at the end. Create your own tables there in
    a session fixture of yours."""
    server = request.config.getoption("pgworker_dsn", None) or os.environ.get(DSN_VARIABLE)
    if not server:
        pytest.fail(
            "pgworker.testing needs a PostgreSQL server: pass --pgworker-dsn "
            f"postgresql://user@host/db or set {DSN_VARIABLE} (a scratch database is created "
            "there for the session, and dropped after it)",
            pytrace=False,
        )
    database = f"pgworker_test_{uuid.uuid4().hex[:12]}"
    dsn = _in_a_thread(lambda: _create_database(server, database))
    try:
        yield dsn
    finally:
        _in_a_thread(lambda: _drop_database(server, database))


@pytest.fixture
def pgworker_dsn(pgworker_database: str) -> str:
    """The DSN of the scratch database, its pgworker tables emptied (TRUNCATE, job ids from 1
    again) before this test."""
    _in_a_thread(lambda: _reset(pgworker_database))
    return pgworker_database


def _async_fixture(fn: Fixture) -> Fixture:
    """An async fixture: pytest-asyncio's when installed (whatever its mode), else a plain one,
    which anyio's pytest plugin drives."""
    try:
        import pytest_asyncio
    except ImportError:
        return cast(Fixture, pytest.fixture(fn))
    return cast(Fixture, pytest_asyncio.fixture(fn))


@_async_fixture
async def pgworker_conn(pgworker_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """An asyncpg connection to the scratch database (emptied before this test), closed after
    it."""
    conn = await asyncpg.connect(pgworker_dsn)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            await conn.close()
