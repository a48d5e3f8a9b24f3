"""Enqueue: what services import. It validates everything before writing anything, and lets the
database's UNIQUE constraint decide idempotency."""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from . import db
from .errors import IdempotencyConflict, PgWorkerError, ValidationError
from .models import (
    DEFAULT_QUEUE,
    PRIORITY_LABELS,
    EnqueueResult,
    Job,
    JobSpec,
    JobStatus,
    current_correlation_id,
)

DEFAULT_SCHEMA = "pgworker"
_INT32 = 2**31 - 1


def _text(field: str, value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError(field, f"must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL characters")
    return value


def _priority(field: str, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        if value in PRIORITY_LABELS:
            return PRIORITY_LABELS[value]
        labels = ", ".join(PRIORITY_LABELS)
        raise ValidationError(field, f"unknown label {value!r}; use an int or one of {labels}")
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > _INT32:
        raise ValidationError(field, f"must be an int or a label, got {value!r}")
    return value


def _max_retries(field: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32:
        raise ValidationError(field, f"must be an int >= 0, got {value!r}")
    return value


def _payload(field: str, value: Any) -> str:
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValidationError(field, f"must be JSON-serialisable ({exc})") from exc
    if "\\u0000" in text:
        raise ValidationError(field, "must not contain NUL characters (jsonb cannot store them)")
    return text


def _schedule(prefix: str, run_at: Any, delay: Any) -> tuple[datetime | None, float | None]:
    if run_at is not None and delay is not None:
        raise ValidationError(f"{prefix}run_at", "give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ValidationError(f"{prefix}run_at", f"must be a datetime, got {run_at!r}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ValidationError(
                f"{prefix}run_at", "must be timezone-aware, e.g. datetime.now(timezone.utc)"
            )
        return run_at, None
    if delay is None:
        return None, None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ValidationError(f"{prefix}delay", f"must be a timedelta or seconds, got {delay!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValidationError(f"{prefix}delay", f"must be >= 0 seconds, got {delay!r}")
    return None, seconds


def _prepare(spec: JobSpec, prefix: str = "") -> tuple[Any, ...]:
    """Validate one spec into the column values of `jobs`, in the order the queries take them."""
    run_at, delay = _schedule(prefix, spec.run_at, spec.delay)
    correlation = spec.correlation_id
    if correlation is None:
        correlation = current_correlation_id.get() or str(uuid.uuid4())
    return (
        _text(f"{prefix}type", spec.type, required=True),
        _text(f"{prefix}queue", spec.queue, required=False) or DEFAULT_QUEUE,
        _payload(f"{prefix}payload", spec.payload),
        _priority(f"{prefix}priority", spec.priority),
        _max_retries(f"{prefix}max_retries", spec.max_retries),
        _text(f"{prefix}idempotency_key", spec.idempotency_key, required=False),
        _text(f"{prefix}correlation_id", correlation, required=True),
        run_at,
        delay,
    )


def _result(row: Any, key: str | None) -> EnqueueResult:
    if not row["matches"]:
        raise IdempotencyConflict(key or "", row["id"])
    return EnqueueResult(job=Job.from_record(row), created=row["created"])


async def enqueue(
    conn: db.Executor,
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | str | None = None,
    max_retries: int | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    run_at: datetime | None = None,
    delay: timedelta | float | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> EnqueueResult:
    """Insert one job and notify the workers of its queue.

    On a Connection inside a transaction, the job and its notification exist only if that
    transaction commits. With an idempotency key already used for the same type and payload,
    the existing job comes back with `created=False`; with another type or payload,
    IdempotencyConflict is raised and nothing is written.
    """
    spec = JobSpec(
        type,
        {} if payload is None else payload,
        queue,
        priority,
        max_retries,
        idempotency_key,
        correlation_id,
        run_at,
        delay,
    )
    args = _prepare(spec)
    row = await db.insert_job(conn, schema, *args)
    if row is None:
        # A concurrent enqueue committed this key after our statement's snapshot was taken.
        found = await db.get_jobs_by_keys(conn, schema, [args[5]], [args[0]], [args[2]])
        row = found.get(args[5])
        if row is None:
            raise PgWorkerError(
                f"idempotency_key {idempotency_key!r}: the job holding it vanished during the "
                "enqueue; try again"
            )
    return _result(row, idempotency_key)


async def enqueue_many(
    conn: db.Executor, specs: Sequence[JobSpec], *, schema: str = DEFAULT_SCHEMA
) -> list[EnqueueResult]:
    """Insert many jobs in one statement and one transaction (a savepoint inside the caller's);
    results come in the order of `specs`. Any invalid spec or idempotency conflict raises before
    anything is kept."""
    prepared = []
    specs_of: list[JobSpec] = []
    first_of_key: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, JobSpec):
            raise ValidationError(f"specs[{i}]", f"must be a pgworker.JobSpec, got {spec!r}")
        args = _prepare(spec, f"specs[{i}].")
        key = args[5]
        if key is not None and key in first_of_key:
            first = prepared[first_of_key[key]]
            if (first[0], first[2]) != (args[0], args[2]):
                raise IdempotencyConflict(key, None)
            repeats[i] = first_of_key[key]
            continue
        if key is not None:
            first_of_key[key] = len(prepared)
        specs_of.append(spec)
        prepared.append(args)
    if not prepared:
        return []
    columns = [list(col) for col in zip(*prepared, strict=True)]
    async with db.transaction(conn) as c:
        inserted = {r["ord"] - 1: r for r in await db.insert_jobs(c, schema, *columns)}
        taken = [args for i, args in enumerate(prepared) if i not in inserted]
        existing = {}
        if taken:
            existing = await db.get_jobs_by_keys(
                c, schema, [a[5] for a in taken], [a[0] for a in taken], [a[2] for a in taken]
            )
        unique_results = []
        for i, args in enumerate(prepared):
            row = inserted.get(i)
            if row is not None:
                unique_results.append(EnqueueResult(_new_job(args, specs_of[i], row), True))
                continue
            row = existing.get(args[5])
            if row is None:
                raise PgWorkerError(
                    f"specs: idempotency_key {args[5]!r}: the job holding it vanished during "
                    "the enqueue; try again"
                )
            unique_results.append(_result(row, args[5]))
    results: list[EnqueueResult] = []
    u = iter(unique_results)
    for i in range(len(specs)):
        if i in repeats:
            results.append(EnqueueResult(job=unique_results[repeats[i]].job, created=False))
        else:
            results.append(next(u))
    return results


def _new_job(args: tuple[Any, ...], spec: JobSpec, row: Any) -> Job:
    """The row just inserted, from the values sent and the few the database chose."""
    type_, queue, _payload, priority, max_retries, key, correlation, _run_at, _delay = args
    return Job(
        id=row["id"],
        type=type_,
        queue=queue,
        payload=spec.payload,
        priority=priority,
        status=JobStatus.PENDING,
        retry_count=0,
        max_retries=max_retries,
        attempts=0,
        idempotency_key=key,
        correlation_id=correlation,
        run_at=row["run_at"],
        claimed_at=None,
        worker_id=None,
        lease_expires_at=None,
        error=None,
        progress=None,
        result=None,
        created_at=row["created_at"],
        updated_at=row["created_at"],
        finished_at=None,
    )
