"""What operators and services do to jobs besides enqueueing them: read one, cancel one, list
and replay the failed ones (the dead-letter set), prune old finished ones, pause and limit
queues, and create or upgrade the schema."""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import Enum, StrEnum
from typing import Any

import asyncpg

from . import _validate as validate
from . import settings
from ._db import migrations
from ._db.connection import Conn, Executor
from ._db.queries import queries, transaction
from ._filters import JobFilter
from ._logs import get_logger
from ._redact import DEFAULT_KEYS, redact_payload
from .errors import PgWorkerError, ValidationError
from .models import DEFAULT_SCHEMA, Job, JobStatus


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
    return validate.count("job_id", value, minimum=1, maximum=validate.MAX_BIGINT)


async def get_job(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> Job | None:
    """The job's current row (status, result, error, retry_count, progress) with the results of
    the steps it has done (`Job.steps`, by name), or None."""
    q = queries(validate.identifier("schema", schema))
    row = await q.job_get(conn, _job_id(job_id))
    if row is None:
        return None
    steps = {
        s["name"]: _decoded(s["result"], f"the result of step {s['name']!r}")
        for s in await q.job_steps_of(conn, row["id"])
    }
    return dataclasses.replace(Job.from_record(row), steps=steps)


async def job_steps(
    conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """The steps the job has done, in the order they finished: dicts with `name`, `result`
    (decoded), `attempt`, `started_at` and `finished_at`. Empty for an unknown job."""
    q = queries(validate.identifier("schema", schema))
    return [
        {**dict(r), "result": _decoded(r["result"], f"the result of step {r['name']!r}")}
        for r in await q.job_steps_of(conn, _job_id(job_id))
    ]


async def job_milestones(
    conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """Every milestone the job reported (`ctx.progress`), oldest first: dicts with `seq`,
    `attempt`, `milestone`, `detail` (decoded) and `at`. Empty for an unknown job."""
    q = queries(validate.identifier("schema", schema))
    return [
        {**dict(r), "detail": _decoded(r["detail"], f"the detail of milestone {r['seq']}")}
        for r in await q.job_milestones_of(conn, _job_id(job_id))
    ]


def _decoded(text: str | None, what: str = "a value") -> Any:
    """JSON text decoded; one Python cannot decode (nested past its recursion limit: written
    around pgworker's checks) is a PgWorkerError saying what it is, not a RecursionError."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (RecursionError, ValueError) as exc:
        raise PgWorkerError(
            f"{what} cannot be decoded ({type(exc).__name__}: {exc}); it was written around "
            "pgworker's checks: read it in SQL, then fix or delete the row"
        ) from None


async def cancel(conn: Executor, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> CancelResult:
    """Cancel a job and say what happened (see CancelResult). Raises ValidationError when there
    is no such job."""
    q = queries(validate.identifier("schema", schema))
    row = await q.job_cancel(conn, _job_id(job_id))
    if row is None:
        raise ValidationError("job_id", f"there is no job {job_id}")
    previous = row["previous"]
    if previous == "pending":
        return CancelResult.CANCELLED
    if previous == "running":
        return CancelResult.CANCELLING
    return CancelResult(f"already {previous}")


async def migrate(
    conn: Executor, *, schema: str = DEFAULT_SCHEMA, pooler: bool = False
) -> list[int]:
    """Apply pending migrations on an asyncpg Connection (or one of a pool's); returns the
    versions applied. `pooler=True` through a transaction pooler (PgBouncer in transaction
    mode): the pending migrations are applied in one transaction, under a transaction-level
    lock. Either way, the pooled functions of older releases that no registered worker calls
    are dropped (docs/operations/poolers.md)."""
    schema = validate.identifier("schema", schema)
    if isinstance(conn, asyncpg.Pool):
        # One connection throughout: the advisory lock is taken and released on the session
        # that applies the migrations.
        async with conn.acquire() as c:
            return await migrations.migrate(c, schema, pooler=pooler)
    return await migrations.migrate(conn, schema, pooler=pooler)


async def status(
    conn: Executor, *, schema: str = DEFAULT_SCHEMA, live_within: float = 60.0
) -> dict[str, list[Any]]:
    """What `pgworker status` shows: counts per queue and status, the oldest pending job per
    queue, queues no live worker serves, the live workers, and `controls`: the queues paused or
    limited now (QueueState, by name), which explain a backlog the counts alone do not."""
    q = queries(validate.identifier("schema", schema))
    live_within = validate.seconds("live_within", live_within, zero=False)
    return {
        "counts": await q.status_counts(conn),
        "oldest_pending": await q.status_oldest_pending(conn),
        "unserved": await q.status_unserved(conn, live_within),
        "workers": await q.status_workers(conn, live_within),
        "controls": [
            c
            for c in (_queue_state(r) for r in await q.queue_controls(conn))
            if c.paused or c.limits
        ],
    }


# --- failed jobs, replay, retention --------------------------------------------------------------

FINISHED = ("completed", "failed", "cancelled")
"""The statuses `prune` deletes by default."""
REPLAYABLE = frozenset({"failed", "cancelled"})
REPLAY_BATCH = 1000
"""Jobs replayed per statement (and transaction) by `replay(type=...)`."""
PRUNE_BATCH = 1000
"""Jobs deleted per statement by `prune` and by the leader's retention."""
MAX_ACTOR_LENGTH = 200
MAX_REASON_LENGTH = 2000


@dataclasses.dataclass(frozen=True, slots=True)
class FailedJob:
    """One job of the dead-letter set, as `list_failed` and `pgworker failed list` show it: the
    attempts' first and last start times, and the first line of its error."""

    id: int
    type: str
    queue: str
    correlation_id: str
    attempts: int
    first_attempt_at: datetime | None
    last_attempt_at: datetime | None
    error: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayResult:
    """What `replay` did (or, with dry_run, would do): the ids put back to pending, and the
    jobs left alone with the status that kept them (only failed and cancelled jobs replay)."""

    replayed: tuple[int, ...]
    skipped: Mapping[int, str]
    dry_run: bool = False
    held: Mapping[int, int] = dataclasses.field(default_factory=dict)
    """Of the skipped jobs, those whose unique key another live job holds now, with its id:
    replayed, they would be a second live job of the key (see "Unique jobs" in the guide)."""


def since_moment(field: str, value: object) -> datetime | None:
    """The earliest failure time a `since` selects: a duration back from now (a timedelta, a
    number of seconds, or text such as `30s`, `15m`, `2h`, `7d`), or a time (a timezone-aware
    datetime, or ISO 8601 text with a time zone). Durations are measured on this machine's
    clock."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return validate.moment(field, value)
    if isinstance(value, str):
        try:
            return datetime.now(UTC) - timedelta(seconds=settings.duration(field, value))
        except ValidationError:
            pass
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValidationError(
                field,
                "must be a duration such as 30s, 15m, 2h or 7d, or an ISO 8601 time with a time "
                f"zone such as 2030-01-01T09:00:00+00:00, got {value!r}",
            ) from None
        if moment.tzinfo is None:
            raise ValidationError(
                field, f"{value!r} has no time zone; add one, e.g. {value.strip()}+00:00"
            )
        return validate.moment(field, moment)
    return datetime.now(UTC) - timedelta(seconds=validate.seconds(field, value))


def _summary(error: str | None) -> str | None:
    """An error's first line."""
    return None if error is None else (error.strip().splitlines() or [""])[0]


async def list_failed(
    conn: Executor,
    *,
    type: str | None = None,
    queue: str | None = None,
    since: timedelta | datetime | float | str | None = None,
    limit: int = 100,
    schema: str = DEFAULT_SCHEMA,
) -> list[FailedJob]:
    """The failed jobs (the dead-letter set), newest failure first: of a type, of a queue,
    failed since a duration ago or a time (see `since_moment`), at most `limit`."""
    q = queries(validate.identifier("schema", schema))
    type = validate.name("type", type, validate.MAX_TYPE_LENGTH, required=False)
    queue = validate.name("queue", queue, validate.MAX_QUEUE_LENGTH, required=False)
    cutoff = since_moment("since", since)
    limit = validate.count("limit", limit, minimum=1, maximum=validate.MAX_INT)
    rows = await q.jobs_failed(conn, type, queue, cutoff, limit)
    return [
        FailedJob(
            id=r["id"],
            type=r["type"],
            queue=r["queue"],
            correlation_id=r["correlation_id"],
            attempts=r["attempts"],
            first_attempt_at=r["first_attempt_at"],
            last_attempt_at=r["last_attempt_at"],
            error=_summary(r["error"]),
        )
        for r in rows
    ]


FAILURE_STATUSES = ("failed", "retrying")
"""What `failure_groups` groups: `failed`, the jobs that ended failed (by their latest error);
`retrying`, the failed attempts of the jobs still being retried (pending or running now)."""
FAILURE_WINDOW = timedelta(days=1)
"""The failures `failure_groups` groups when no `since` is given: those of the last day."""
MAX_FAILURE_GROUPS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class FailureGroup:
    """Failures grouped as people think of them: those of one job type whose errors have the
    same class, the same message once its values (ids, numbers, quoted values, paths...) are
    set aside, and the same innermost frame (`fingerprint`, migration 30). `count` jobs (or
    attempts, for `retrying`), the first and last time one ended, the newest one's error as
    `sample`, and `trend`: how many ended in each hour of the last 24, oldest first."""

    fingerprint: str
    type: str
    error_class: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample: str
    trend: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        """The group as GET /failures and `pgworker failed groups --json` give it."""
        return {
            "fingerprint": self.fingerprint,
            "type": self.type,
            "error_class": self.error_class,
            "count": self.count,
            "first_seen": self.first_seen.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "sample": self.sample,
            "trend": list(self.trend),
        }


async def failure_groups(
    conn: Executor,
    *,
    status: str = "failed",
    type: str | None = None,
    queue: str | None = None,
    since: timedelta | datetime | float | str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[FailureGroup]:
    """The failures grouped (see FailureGroup), the largest groups first, at most `limit`:
    with `status` failed, the jobs that failed since `since` (a duration ago or a time, see
    `since_moment`; the last day when None); with `retrying`, the failed attempts started
    since then of the jobs still pending or running. `type` matches the types starting with
    it, as the job lists' filter does. The `fingerprint` is the jobs filter's `error_group`:
    `GET /jobs?error_group=...`, and a bulk action over it replays or cancels the group."""
    if status not in FAILURE_STATUSES:
        raise ValidationError(
            "status", f"must be one of {', '.join(FAILURE_STATUSES)}, got {status!r}"
        )
    q = queries(validate.identifier("schema", schema))
    type = validate.name("type", type, validate.MAX_TYPE_LENGTH, required=False)
    queue = validate.name("queue", queue, validate.MAX_QUEUE_LENGTH, required=False)
    cutoff = since_moment("since", since) or datetime.now(UTC) - FAILURE_WINDOW
    limit = validate.count("limit", limit, minimum=1, maximum=MAX_FAILURE_GROUPS)
    if status == "failed":
        job_filter = JobFilter.checked(
            status="failed", type=type, queue=queue, finished_after=cutoff
        )
        async with transaction(conn) as c:
            await q.plan_with_values(c)
            rows = await q.jobs_failure_groups(c, job_filter.params(), limit)
    else:
        async with transaction(conn) as c:
            await q.plan_with_values(c)
            rows = await q.attempts_failure_groups(c, cutoff, queue, type, limit)
    return [failure_group(r) for r in rows]


def failure_group(row: Any) -> FailureGroup:
    """A row of jobs_failure_groups.sql or attempts_failure_groups.sql."""
    return FailureGroup(
        fingerprint=row["fingerprint"],
        type=row["type"],
        error_class=row["error_class"],
        count=row["count"],
        first_seen=row["first_seen"],
        last_seen=row["last_seen"],
        sample=row["sample"],
        trend=tuple(row["trend"]),
    )


def os_user() -> str:
    """Who replays when `by` is not given: the OS user running the process."""
    try:
        return getpass.getuser()
    except Exception:  # no name for this uid (a container without a passwd entry)
        return f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"


def _ids(value: object) -> list[int]:
    """Job ids: a non-empty list of ints a bigint holds, duplicates dropped."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValidationError("ids", f"must be a list of job ids, got {value!r}")
    ids = list(value)
    if not ids:
        raise ValidationError("ids", "must name at least one job")
    for i in ids:
        validate.count("ids", i, minimum=1, maximum=validate.MAX_BIGINT)
    return list(dict.fromkeys(ids))


async def replay(
    conn: Executor,
    ids: Iterable[int] | None = None,
    *,
    type: str | None = None,
    since: timedelta | datetime | float | str | None = None,
    queue: str | None = None,
    by: str | None = None,
    reason: str | None = None,
    dry_run: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> ReplayResult:
    """Put failed jobs back to pending now, on purpose: by `ids` (failed or cancelled jobs; any
    other is left alone and reported in `skipped`), or every failed job of `type` (of `queue`,
    failed since `since`; cancelled jobs were stopped on purpose: replay those by id).

    A replayed job gets retry_count 0, a fresh retry-time budget, no error and no cancel
    request; its attempts number on, their history kept. Each replay is recorded in
    `job_events` (kind `replayed`, actor `by`, default the OS user, and `reason`) and logged as
    one line without the payload. An unknown id is a ValidationError naming `ids`, and nothing
    is written. With `dry_run`, nothing is written either: the result says what would be done.
    Runs in its own transactions: pass a connection outside a transaction, or a pool."""
    q = queries(validate.identifier("schema", schema))
    actor, reason = _replayer(by, reason)
    if not isinstance(dry_run, bool):
        raise ValidationError("dry_run", f"must be True or False, got {dry_run!r}")
    if ids is not None:
        if type is not None or since is not None or queue is not None:
            raise ValidationError("ids", "give job ids, or type= (with since=, queue=), not both")
        wanted = _ids(ids)
    elif type is None:
        raise ValidationError(
            "ids",
            "give the ids of the jobs to replay, or type= to replay the failed jobs of a type",
        )
    else:
        type = validate.name("type", type, validate.MAX_TYPE_LENGTH)
        queue = validate.name("queue", queue, validate.MAX_QUEUE_LENGTH, required=False)
        wanted = await q.jobs_failed_ids(conn, type, queue, since_moment("since", since))
    if dry_run:
        found = await q.jobs_statuses(conn, wanted)
        if ids is not None:
            _no_unknown(wanted, found)
        held = await q.jobs_unique_held(conn, wanted)
        return ReplayResult(
            tuple(i for i in wanted if found.get(i) in REPLAYABLE and i not in held),
            {i: s for i, s in found.items() if s not in REPLAYABLE or i in held},
            dry_run=True,
            held=held,
        )
    done: list[Any] = []
    # By ids: one transaction, so that an unknown id leaves everything as it was. By type: a
    # batch per transaction, so that a large replay never holds many locks for long.
    chunks = [wanted] if ids is not None else _chunks(wanted, REPLAY_BATCH)
    for chunk in chunks:
        async with transaction(conn) as c:
            rows = await q.jobs_replay(c, chunk, actor, reason)
            if ids is not None:
                _no_unknown(chunk, {r["id"]: r["previous"] for r in rows})
        _announce(rows, actor, reason)
        done += rows
    return _replayed(done)


async def replay_uncommitted(
    conn: Conn, ids: Iterable[int], *, by: str, reason: str | None, schema: str = DEFAULT_SCHEMA
) -> tuple[ReplayResult, Callable[[], None]]:
    """`replay(conn, ids)` in the caller's transaction (a request of `serve`): its result, and
    what logs each replay, to call once that transaction has committed. A request given up is
    rolled back: it replayed nothing, and no line may say it did."""
    q = queries(validate.identifier("schema", schema))
    actor, reason = _replayer(by, reason)
    wanted = _ids(ids)
    rows = await q.jobs_replay(conn, wanted, actor, reason)
    _no_unknown(wanted, {r["id"]: r["previous"] for r in rows})
    return _replayed(rows), lambda: _announce(rows, actor, reason)


def _replayer(by: str | None, reason: str | None) -> tuple[str, str | None]:
    actor = validate.name("by", os_user() if by is None else by, MAX_ACTOR_LENGTH)
    return actor, validate.name("reason", reason, MAX_REASON_LENGTH, required=False)


def _replayed(rows: Sequence[Any]) -> ReplayResult:
    return ReplayResult(
        tuple(r["id"] for r in rows if r["replayed"]),
        {r["id"]: r["previous"] for r in rows if not r["replayed"]},
        held={r["id"]: r["held_by"] for r in rows if r["held_by"] is not None},
    )


def _announce(rows: Iterable[Any], actor: str, reason: str | None) -> None:
    """One line per job replayed, once the transaction that replayed it has committed."""
    log = get_logger()
    for r in rows:
        if r["replayed"]:
            log.info(
                "job replayed",
                job_id=r["id"],
                type=r["type"],
                queue=r["queue"],
                correlation_id=r["correlation_id"],
                previous_status=r["previous"],
                next_attempt=r["attempts"] + 1,
                actor=actor,
                reason=reason,
            )


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _no_unknown(wanted: Iterable[int], found: Mapping[int, str]) -> None:
    missing = [i for i in wanted if i not in found]
    if missing:
        listed = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
        raise ValidationError("ids", f"there is no job {listed}; nothing was replayed")


def _statuses(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValidationError("statuses", f"must be a list of statuses, got {value!r}")
    found = tuple(value)
    if not found or any(not isinstance(s, str) or s not in FINISHED for s in found):
        raise ValidationError(
            "statuses", f"must be one or more of {', '.join(FINISHED)}, got {value!r}"
        )
    return tuple(dict.fromkeys(found))


async def prune(
    conn: Executor,
    *,
    older_than: timedelta | float | str,
    statuses: Iterable[str] = FINISHED,
    dry_run: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> dict[str, int]:
    """Delete the jobs of `statuses` (finished ones: completed, failed, cancelled) that finished
    more than `older_than` ago (seconds, a timedelta, or text such as `7d`), with their
    attempts, steps, milestones and events, in batches of at most 1,000 jobs per statement;
    returns how many of each status went (with `dry_run`: would go, nothing deleted). Their
    idempotency keys become free. What the elected worker does by itself (Settings'
    retain_completed, retain_failed); run it outside a transaction, so each batch commits."""
    q = queries(validate.identifier("schema", schema))
    if isinstance(older_than, str):
        age = settings.duration("older_than", older_than)
    else:
        age = validate.seconds("older_than", older_than)
    if age == 0:
        raise ValidationError("older_than", "must be more than 0 (1s prunes every finished job)")
    wanted = _statuses(statuses)
    if not isinstance(dry_run, bool):
        raise ValidationError("dry_run", f"must be True or False, got {dry_run!r}")
    ages = dict.fromkeys(wanted, age)
    pruned = dict.fromkeys(wanted, 0)
    if dry_run:
        return {**pruned, **await q.jobs_prunable(conn, ages)}
    while True:
        batch = await q.jobs_prune(conn, ages, PRUNE_BATCH)
        for status, n in batch.items():
            pruned[status] += n
        if sum(batch.values()) < PRUNE_BATCH:
            return pruned


_NOT_ENDED = frozenset({"pending", "running"})


async def show_job(
    conn: Executor,
    job_id: int,
    *,
    redact_keys: Sequence[str] = DEFAULT_KEYS,
    schema: str = DEFAULT_SCHEMA,
) -> dict[str, Any] | None:
    """What `pgworker show` prints: the job, its payload with the values of sensitive keys
    (`redact_keys`, see Settings) replaced by `[REDACTED]`, its milestones, its steps, every
    attempt (outcome, worker, times, error), what people did to it (replays) and its event
    waits (ctx.wait_for_event); None when there is no such job. A job enqueued with after= also
    lists `parents` (id -> status, None for one pruned since) and `waits_for`, the parents that
    have not ended."""
    q = queries(validate.identifier("schema", schema))
    job_id = _job_id(job_id)
    if isinstance(redact_keys, str) or not isinstance(redact_keys, Sequence):
        raise ValidationError("redact_keys", f"must be a list of key names, got {redact_keys!r}")
    for key in redact_keys:
        validate.name("redact_keys", key, validate.MAX_QUEUE_LENGTH)
    row = await q.job_get(conn, job_id)
    if row is None:
        return None
    job = Job.from_record(row)
    parents: dict[int, str | None] = {}
    if job.parents is not None:
        found = await q.jobs_statuses(conn, job.parents)
        parents = {i: found.get(i) for i in job.parents}
    return {
        "job": job,
        "parents": parents,
        "waits_for": [i for i, status in parents.items() if status in _NOT_ENDED],
        "payload": redact_payload(job.payload, redact_keys),
        "milestones": await job_milestones(conn, job_id, schema=schema),
        "steps": await job_steps(conn, job_id, schema=schema),
        "attempts": [dict(r) for r in await q.job_attempts_of(conn, job_id)],
        "events": [
            {**dict(r), "detail": _decoded(r["detail"], "the detail of an event")}
            for r in await q.job_events_of(conn, job_id)
        ],
        "waits": [
            {**dict(r), "data": _decoded(r["data"], "the data of an event")}
            for r in await q.job_event_waits_of(conn, job_id)
        ],
    }


def waiting_for(job: Job, waits: Sequence[Mapping[str, Any]]) -> str | None:
    """What a pending job waits for (ctx.wait_for_event): "event NAME (until DEADLINE)" with
    the deadline in ISO 8601, "event NAME" without one; None when it waits for no event."""
    if job.status is not JobStatus.PENDING or not waits:
        return None
    last = waits[-1]
    if last["event_id"] is not None or last["timed_out"]:
        return None
    deadline = last["deadline"]
    until = "" if deadline is None else f" (until {deadline.isoformat()})"
    return f"event {last['name']}{until}"


@dataclasses.dataclass(frozen=True, slots=True)
class PeriodicSchedule:
    """One periodic schedule as the database knows it (the `periodic` table, written by the
    leader of a fleet defining it: `pgworker periodic list`, the dashboard, `GET /periodic`).
    `schedule` says when it runs (`cron 30 2 * * * Europe/Paris`, `every 60s`); `last_slot` is the
    last slot enqueued and `last_job_status` its job's status (None once pruned, or before the
    first); `next_slot` the next one due; `checked_at` when a leader defining it last looked: a
    schedule removed from every fleet's code keeps its row, its `checked_at` getting old."""

    name: str
    task: str
    schedule: str
    last_slot: datetime | None
    next_slot: datetime
    last_job_id: int | None
    last_job_status: str | None
    checked_at: datetime


async def list_periodic(
    conn: Executor, *, limit: int = 1000, schema: str = DEFAULT_SCHEMA
) -> list[PeriodicSchedule]:
    """The periodic schedules recorded in the database, by name, at most `limit`."""
    q = queries(validate.identifier("schema", schema))
    limit = validate.count("limit", limit, minimum=1, maximum=validate.MAX_INT)
    rows = await q.periodic_list(conn, limit)
    return [
        PeriodicSchedule(
            name=r["name"],
            task=r["type"],
            schedule=r["schedule"],
            last_slot=r["last_slot"],
            next_slot=r["next_slot"],
            last_job_id=r["last_job_id"],
            last_job_status=r["last_job_status"],
            checked_at=r["checked_at"],
        )
        for r in rows
    ]


# --- queue controls: pausing and limits ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class QueueState:
    """A queue's controls, as `pause_queue`, `resume_queue`, `limit_queue` and `list_queues`
    return them.

    `paused_at`, `paused_by` and `reason` say who paused it, when and why (None when it is not
    paused). `max_running` is the most of its jobs running at once across the fleet, `rate` the
    most starts per period (`'600/m'`); None: no such limit. `pending` and `running` count its
    jobs (`list_queues` only; None from the changes, which count nothing). `changed` says
    whether this call of pause_queue, resume_queue or limit_queue changed the queue (False: it
    already was so, and nothing was written or logged); `known` whether, before it, a controls
    row, a pending job or a registered worker named the queue (False: a queue no one named yet,
    perhaps a typo; its controls were created all the same)."""

    name: str
    paused_at: datetime | None = None
    paused_by: str | None = None
    reason: str | None = None
    pending: int | None = None
    running: int | None = None
    changed: bool = False
    known: bool = True
    max_running: int | None = None
    rate: str | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def limits(self) -> dict[str, Any]:
        """The limits set, by the names limit_queue takes (`max_running`, `rate`); empty when
        the queue has none."""
        found = {"max_running": self.max_running, "rate": self.rate}
        return {k: v for k, v in found.items() if v is not None}

    def as_json(self) -> dict[str, Any]:
        """The state as JSON keys (times in ISO 8601), as the CLI and the HTTP API show it."""
        return {
            "queue": self.name,
            "paused": self.paused,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "pause_reason": self.reason,
            "pending": self.pending,
            "running": self.running,
            "limits": self.limits,
        }


def rate_text(count: int | None, period: int | None) -> str | None:
    """A stored rate as limit_queue takes it (`600/m`); a period that has no unit (written by
    hand in SQL) in seconds (`5/90s`)."""
    if count is None or period is None:
        return None
    if period in (1, 60, 3600, 86400):
        return str(validate.Rate(count, period))
    return f"{count}/{period}s"


def _queue_state(row: Any, *, counted: bool = False) -> QueueState:
    return QueueState(
        name=row["name"],
        paused_at=row["paused_at"],
        paused_by=row["paused_by"],
        reason=row["pause_reason"],
        pending=row["pending"] if counted else None,
        running=row["running"] if counted else None,
        changed=bool(row.get("changed", False)) if not counted else False,
        known=bool(row.get("known", True)) if not counted else True,
        max_running=row["max_running"],
        rate=rate_text(row["rate_limit"], row["rate_period"]),
    )


def _controller(queue: object, by: str | None, reason: str | None) -> tuple[str, str, str | None]:
    """The queue, actor and reason of a pause or resume, checked as enqueue and replay check
    them."""
    name = validate.name("queue", queue, validate.MAX_QUEUE_LENGTH)
    actor, reason = _replayer(by, reason)
    return name, actor, reason


async def pause_queue(
    conn: Executor,
    queue: str,
    reason: str | None = None,
    *,
    by: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> QueueState:
    """Pause `queue` on every worker: the claims that start once this commits take none of its
    jobs (its running jobs finish; enqueue still works, its jobs wait as pending). Recorded in
    `operator_log` with `by` (default: the OS user) and `reason`. A queue already paused is left
    as it is, its first pause's who, when and why kept, and nothing is logged (`changed` False).
    A queue no pending job or worker names yet is paused all the same, its controls created
    (`known` False), so that it can be paused before its first job. In the caller's transaction
    when `conn` is in one (the pause takes effect when it commits)."""
    q = queries(validate.identifier("schema", schema))
    name, actor, reason = _controller(queue, by, reason)
    for _ in range(2):  # a second time when a concurrent pause created the row meanwhile
        async with transaction(conn) as c:
            row = await q.queue_pause(c, name, actor, reason)
        if row is not None:
            return _queue_state(row)
    raise PgWorkerError(f"queue {name!r}: its controls row could not be read back; try again")


async def resume_queue(
    conn: Executor,
    queue: str,
    reason: str | None = None,
    *,
    by: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> QueueState:
    """Resume a paused `queue`: every worker serving it is woken when this commits and claims
    its backlog at once. Recorded in `operator_log` with `by` (default: the OS user), `reason`
    and the pause it ended. A queue not paused is left as it is and nothing is logged
    (`changed` False)."""
    q = queries(validate.identifier("schema", schema))
    name, actor, reason = _controller(queue, by, reason)
    async with transaction(conn) as c:
        row = await q.queue_resume(c, name, actor, reason)
    return _queue_state(row)


class Unchanged(Enum):
    """The default of limit_queue's limits: leave that limit as it is (None clears it)."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED
"""Leave a limit as it is (limit_queue's default); None clears it."""


def _max_running(value: object) -> int | None:
    if value is None:
        return None
    return validate.count("max_running", value, minimum=1, maximum=validate.MAX_INT)


def _rate(value: object) -> validate.Rate | None:
    """A rate as text (`600/m`) or a `Rate`, checked as a task's rate_limit is."""
    if value is None:
        return None
    if isinstance(value, validate.Rate):
        if value.period not in (1, 60, 3600, 86400):
            raise ValidationError(
                "rate", f"must have a period of 1, 60, 3600 or 86400 seconds, got {value!r}"
            )
        value = str(value)
    return validate.rate("rate", value)


async def limit_queue(
    conn: Executor,
    queue: str,
    *,
    max_running: int | Unchanged | None = UNCHANGED,
    rate: str | validate.Rate | Unchanged | None = UNCHANGED,
    reason: str | None = None,
    by: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> QueueState:
    """Limit `queue` on every worker at once: at most `max_running` of its jobs running across
    the fleet, at most `rate` starts per period (`'10/s'`, `'600/m'`, `'1000/h'`, `'5000/d'`).
    A limit left out stays as it is; None clears it (no limit); give at least one. Kept in the
    database (every worker's claim reads it; it survives restarts) and recorded in
    `operator_log` (action `limit`, `detail` the limits before and after) with `by` (default:
    the OS user) and `reason`; the queue's workers are woken when it commits. Limits that
    already are so change nothing and log nothing (`changed` False). A queue nothing names yet
    gets its controls all the same (`known` False), as pause_queue does. A bad value is a
    ValidationError naming `max_running` or `rate`, and nothing is written. In the caller's
    transaction when `conn` is in one."""
    q = queries(validate.identifier("schema", schema))
    name, actor, reason = _controller(queue, by, reason)
    if max_running is UNCHANGED and rate is UNCHANGED:
        raise ValidationError(
            "max_running", "give max_running= or rate= (None clears it), or both; got neither"
        )
    most = (False, None) if max_running is UNCHANGED else (True, _max_running(max_running))
    every = _rate(rate) if rate is not UNCHANGED else None
    starts = (
        (False, None, None)
        if rate is UNCHANGED
        else (
            True,
            None if every is None else every.starts,
            None if every is None else every.period,
        )
    )
    for _ in range(2):  # a second time when a concurrent change created the row meanwhile
        async with transaction(conn) as c:
            row = await q.queue_limit(c, name, actor, reason, most, starts)
        if row is not None:
            return _queue_state(row)
    raise PgWorkerError(f"queue {name!r}: its controls row could not be read back; try again")


async def queue_controls(conn: Executor, *, schema: str = DEFAULT_SCHEMA) -> list[QueueState]:
    """The controls of the queues that have any (a pause or a limit, past or present), by name,
    without counting their jobs (`pending` and `running` None): for pages that count them
    already."""
    q = queries(validate.identifier("schema", schema))
    return [_queue_state(r) for r in await q.queue_controls(conn)]


async def list_queues(conn: Executor, *, schema: str = DEFAULT_SCHEMA) -> list[QueueState]:
    """Every queue that a job names or that has controls, by name: paused or not (by whom, since
    when, why), its limits, and its pending and running jobs. Counts the whole jobs table, as
    `status` does."""
    q = queries(validate.identifier("schema", schema))
    return [_queue_state(r, counted=True) for r in await q.queue_list(conn)]
