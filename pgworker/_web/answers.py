"""What the HTTP API answers: one typed model per answer, so that the OpenAPI document describes
responses as well as requests (a client generated from it, and schemathesis's response checks,
read them), and the rendering of rows into those answers.

The models describe; they never serialise. Every route renders its answer itself with the stdlib
encoder (`answer`), inside its transaction, before the write it reports commits (see api.py):
FastAPI returns a Response as it is. The models must therefore say exactly what `job_json` and the
routes write, nulls included; tests/test_openapi.py holds them to it with schemathesis's
response_schema_conformance.

A job is keyed by the `jobs` column names (models.JOB_FIELDS), JSON-safe: times in ISO 8601,
payload, progress and result as JSON. A JSON column Python cannot decode (nested deeper than
enqueue accepts, written around pgworker's checks) is null, and `unreadable` says which and why."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from .. import _validate as validate
from .._db.queries import Row
from .._redact import summary
from ..models import JOB_FIELDS, JSON_COLUMNS, Job, JobStatus
from .schemas import JsonValue

Time = datetime
"""A moment, in the answer as ISO 8601 text with its offset (`2030-01-01T09:00:00+00:00`)."""


class Health(BaseModel):
    """GET /healthz: the database answers and its schema is current."""

    status: Literal["ok"]


class JobAnswer(BaseModel):
    """A job: the columns of `jobs` (docs/operations/states.md, Tables)."""

    id: int
    type: str
    queue: str
    payload: JsonValue = Field(description="null when `unreadable` names it")
    priority: int
    status: JobStatus
    retry_count: int
    max_retries: int | None
    attempts: int
    idempotency_key: str | None
    correlation_id: str
    run_at: str = Field(
        description="ISO 8601; a job parked (waiting for its parents or an event) runs at "
        "`9999-12-31T23:59:59.999999`, without an offset"
    )
    claimed_at: Time | None
    worker_id: str | None
    lease_expires_at: Time | None
    error: str | None
    progress: JsonValue = Field(description="the last milestone's detail")
    result: JsonValue
    created_at: Time
    updated_at: Time
    finished_at: Time | None
    version: int
    budget_started_at: Time | None
    traceparent: str | None
    scheduled_at: Time | None
    concurrency_key: str | None
    parents: list[int] | None
    parents_left: int | None
    unique_key: str | None
    unreadable: dict[str, str] | None = Field(
        None,
        description="only when a JSON column cannot be decoded: that column (null above), and why",
    )


class ClaimedJob(JobAnswer):
    """The job claimed: `attempt` (with `worker_id`) is what its heartbeat, complete and fail
    send."""

    attempt: int


class BeatJob(JobAnswer):
    """The job whose lease a heartbeat extended."""

    cancel_requested: bool = Field(description="an operator asked to stop it: stop, then fail")


class CancelledJob(JobAnswer):
    cancel: str = Field(description="cancelled, cancelling, or already <status>")


class Attempt(BaseModel):
    attempt: int
    outcome: str
    worker_id: str
    started_at: Time
    finished_at: Time | None
    error_type: str | None
    error_message: str | None
    error_detail: str | None
    code_version: str | None
    run_ms: float | None
    wait_ms: float | None


class Milestone(BaseModel):
    seq: int
    attempt: int
    milestone: str
    at: Time
    detail: JsonValue
    unreadable: dict[str, str] | None = None


class Step(BaseModel):
    name: str
    attempt: int
    started_at: Time
    finished_at: Time
    result: JsonValue
    unreadable: dict[str, str] | None = None


class JobDetail(JobAnswer):
    """GET /jobs/{id}: the job with its attempts, milestones and steps."""

    attempt_history: list[Attempt]
    milestones: list[Milestone]
    steps: list[Step]


class JobPage(BaseModel):
    """GET /jobs: newest first."""

    jobs: list[JobAnswer]
    next_before: int | None = Field(description="the `before` of the next page; null: the last")


class BulkRunner(BaseModel):
    """Who runs a bulk action: its id, what it is, since when it holds the action, and until
    when it holds it without a batch (after that, another runner adopts it)."""

    id: str
    kind: str = Field(
        description="console (mounted in an application), serve, worker (the maintenance "
        "leader) or cli (`replay --filter`, `cancel --filter`)"
    )
    since: Time | None
    lease_until: Time | None


class BulkAction(BaseModel):
    """A bulk action and its progress."""

    id: int
    kind: str = Field(description="replay, cancel, delete or reschedule")
    filter: dict[str, Any] = Field(description="the filter's keys set (GET /jobs's parameters)")
    run_at: Time | None
    matched: int
    done: int
    skipped: int
    status: str = Field(description="running, done or failed")
    error: str | None
    actor: str
    reason: str | None
    created_at: Time
    updated_at: Time
    finished_at: Time | None
    runner: BulkRunner | None = Field(
        None, description="who runs it (or ran it last); null: no runner has taken it yet"
    )


class BulkActionPage(BaseModel):
    """GET /jobs/actions: newest first."""

    actions: list[BulkAction]
    next_before: int | None = Field(description="the `before` of the next page; null: the last")


class Emitted(BaseModel):
    name: str
    woken: int = Field(description="how many waiting jobs it woke")


class Limits(BaseModel):
    """A queue's limits: each key only when set."""

    max_running: int | None = None
    rate: str | None = Field(None, description="`600/m`; a period written in SQL: `5/90s`")


class Controls(BaseModel):
    queue: str
    paused: bool
    paused_at: Time | None
    paused_by: str | None
    pause_reason: str | None
    limits: Limits


class Counts(BaseModel):
    pending: int
    running: int
    completed: int
    failed: int
    cancelled: int


class QueueEntry(Controls):
    counts: Counts
    oldest_pending_s: float | None = Field(description="null when no pending job is due")


class Queues(BaseModel):
    queues: list[QueueEntry]


class QueueChange(Controls):
    changed: bool = Field(description="false: it already was so; nothing logged")
    known: bool = Field(description="false: nothing named the queue before")


class WorkerEntry(BaseModel):
    worker_id: str
    hostname: str
    pid: int
    queues: list[str]
    types: list[str]
    concurrency: int
    started_at: Time
    last_seen_at: Time
    seen_ago_s: float
    running_job_ids: list[int]


class Workers(BaseModel):
    workers: list[WorkerEntry]


class Schedule(BaseModel):
    name: str
    task: str
    schedule: str
    last_slot: Time | None
    next_slot: Time
    last_job_id: int | None
    last_job_status: str | None
    checked_at: Time


class Schedules(BaseModel):
    schedules: list[Schedule]


class FailureGroupAnswer(BaseModel):
    """GET /failures: one group of failures (operations.FailureGroup)."""

    fingerprint: str = Field(
        description="the group's fingerprint: GET /jobs?error_group= lists its jobs, and a bulk "
        "action's filter `error_group` replays or cancels them"
    )
    type: str = Field(description="the jobs' type")
    error_class: str = Field(description="the exception's class")
    count: int = Field(description="the failed jobs (`retrying`: the failed attempts)")
    first_seen: Time
    last_seen: Time
    sample: str = Field(description="the newest one's error")
    trend: list[int] = Field(
        description="how many ended in each hour of the last 24, oldest first (24 numbers)"
    )


def plain(value: Any) -> Any:
    """A value as JSON can carry it: times in ISO 8601, durations in seconds."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def job_json(row: Row | Job, **extra: Any) -> dict[str, Any]:
    """A job keyed by the `jobs` column names (models.JOB_FIELDS), JSON-safe. A JSON column
    Python cannot decode (nested too deep: written around pgworker's checks) is null, and
    `unreadable` says which and why: one such job hides neither itself nor a page of others."""
    if isinstance(row, Job):
        values = {name: getattr(row, name) for name in JOB_FIELDS}
        unreadable: dict[str, str] = {}
    else:
        values, unreadable = columns(row)
    found = {
        name: value if name in JSON_COLUMNS else plain(value) for name, value in values.items()
    }
    found["status"] = JobStatus(values["status"]).value
    return {**found, **extra, **({"unreadable": unreadable} if unreadable else {})}


def columns(row: Row) -> tuple[dict[str, Any], dict[str, str]]:
    """A row's columns, its JSON ones decoded, and those that cannot be, with why."""
    values: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for name in JOB_FIELDS:
        values[name] = row[name]
        if name in JSON_COLUMNS:
            values[name], why = decoded(row[name])
            if why is not None:
                unreadable[name] = f"the {name} of job {row['id']} cannot be decoded ({why})"
    return values, unreadable


def decoded(text: str | None) -> tuple[Any, str | None]:
    """JSON text decoded (None, and why, when it nests deeper than enqueue accepts, or Python
    cannot decode it at all: written around pgworker's checks)."""
    if text is None:
        return None, None
    try:
        value = json.loads(text)
    except (RecursionError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {summary(str(exc), 200)}"
    deep = len(text) > validate.MAX_DEPTH and text.count("[") + text.count("{") > validate.MAX_DEPTH
    if deep and validate.too_deep(value):
        return None, f"it nests lists and objects more than {validate.MAX_DEPTH} deep"
    return value, None


def with_json(rows: list[Row], column: str) -> list[dict[str, Any]]:
    """Rows (milestones, steps) JSON-safe, their JSON `column` decoded as job_json does (null,
    with `unreadable`, when it cannot be)."""
    found = []
    for r in rows:
        item = {k: plain(v) for k, v in r.items() if k != column}
        item[column], why = decoded(r[column])
        if why is not None:
            item["unreadable"] = {column: why}
        found.append(item)
    return found


class _Rendered(JSONResponse):
    """JSON rendered by the stdlib encoder when made (so inside the request's transaction), as
    plain() would: times in ISO 8601, durations in seconds."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_time_json
        ).encode("utf-8")


def _time_json(value: Any) -> Any:
    if isinstance(value, datetime | timedelta):
        return plain(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def answer(
    content: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The answer, rendered now: any value within validate.MAX_DEPTH fits the stdlib encoder."""
    return _Rendered(content, status_code=status_code, headers=headers)
