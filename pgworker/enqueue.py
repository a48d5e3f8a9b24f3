"""Enqueue: what services import. It validates everything before writing anything, and lets the
database's UNIQUE constraint decide idempotency."""

from __future__ import annotations

import json
import math
import os
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


_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"))


def _payload(field: str, value: Any) -> str:
    try:
        text = _ENCODER.encode(value)
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


def _fields(spec: JobSpec, prefix: str) -> tuple[Any, ...]:
    """Validate a spec's fields but its payload: type, queue, priority, max_retries, key,
    correlation id (None: inherited below, else the database makes one), run_at, delay."""
    run_at, delay = _schedule(prefix, spec.run_at, spec.delay)
    correlation = spec.correlation_id
    if correlation is None:
        correlation = current_correlation_id.get()
    return (
        _text(f"{prefix}type", spec.type, required=True),
        _text(f"{prefix}queue", spec.queue, required=False) or DEFAULT_QUEUE,
        _priority(f"{prefix}priority", spec.priority),
        _max_retries(f"{prefix}max_retries", spec.max_retries),
        _text(f"{prefix}idempotency_key", spec.idempotency_key, required=False),
        _text(f"{prefix}correlation_id", correlation, required=correlation is not None),
        run_at,
        delay,
    )


def _prepare(spec: JobSpec) -> tuple[Any, ...]:
    """Validate one spec into the parameters of job_insert.sql."""
    type_, queue, priority, max_retries, key, correlation, run_at, delay = _fields(spec, "")
    payload = _payload("payload", spec.payload)
    return type_, queue, payload, priority, max_retries, key, correlation, run_at, delay


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
    """Insert many jobs in one transaction (a savepoint inside the caller's): COPY when no spec
    has an idempotency key or a schedule, else one INSERT. Results come in the order of `specs`.
    Any invalid spec or idempotency conflict raises before anything is kept."""
    rows: list[dict[str, Any]] = []
    unique: list[tuple[int, tuple[Any, ...]]] = []  # (index in specs, validated fields)
    first_of_key: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for i, spec in enumerate(specs):
        if not isinstance(spec, JobSpec):
            raise ValidationError(f"specs[{i}]", f"must be a pgworker.JobSpec, got {spec!r}")
        fields = _fields(spec, f"specs[{i}].")
        type_, queue, priority, max_retries, key, correlation, run_at, delay = fields
        if key is not None and key in first_of_key:
            j = first_of_key[key]
            first = specs[unique[j][0]]
            same_payload = _canonical(first.payload, i) == _canonical(spec.payload, i)
            if first.type != type_ or not same_payload:
                raise IdempotencyConflict(key, None)
            repeats[i] = j
            continue
        if key is not None:
            first_of_key[key] = len(unique)
        unique.append((i, fields))
        rows.append(
            {
                "t": type_,
                "q": queue,
                "p": spec.payload,
                "pr": priority,
                "m": max_retries,
                "k": key,
                "c": correlation,
                "r": run_at.isoformat() if run_at else None,
                "d": delay,
            }
        )
    if not rows:
        return []
    if not first_of_key and not any(r["r"] or r["d"] is not None for r in rows):
        return await _copy_many(conn, schema, specs, unique, rows)
    batch = _batch_json(rows, [i for i, _ in unique])
    async with db.transaction(conn) as c:
        inserted = {r["ord"] - 1: r for r in await db.insert_jobs(c, schema, batch)}
        taken = [(i, f) for n, (i, f) in enumerate(unique) if n not in inserted]
        existing = {}
        if taken:
            existing = await db.get_jobs_by_keys(
                c,
                schema,
                [f[4] for _, f in taken],
                [f[0] for _, f in taken],
                [_payload(f"specs[{i}].payload", specs[i].payload) for i, _ in taken],
            )
        unique_results = []
        for n, (i, fields) in enumerate(unique):
            row = inserted.get(n)
            if row is not None:
                unique_results.append(EnqueueResult(_new_job(fields, specs[i], row), True))
                continue
            row = existing.get(fields[4])
            if row is None:
                raise PgWorkerError(
                    f"specs[{i}]: idempotency_key {fields[4]!r}: the job holding it vanished "
                    "during the enqueue; try again"
                )
            unique_results.append(_result(row, fields[4]))
    results: list[EnqueueResult] = []
    u = iter(unique_results)
    for i in range(len(specs)):
        if i in repeats:
            results.append(EnqueueResult(job=unique_results[repeats[i]].job, created=False))
        else:
            results.append(next(u))
    return results


def _random_ids(n: int) -> list[str]:
    """n random UUID-shaped correlation ids, from one read of the random source."""
    h = os.urandom(16 * n).hex()
    return [
        f"{h[k : k + 8]}-{h[k + 8 : k + 12]}-{h[k + 12 : k + 16]}-{h[k + 16 : k + 20]}-"
        f"{h[k + 20 : k + 32]}"
        for k in range(0, 32 * n, 32)
    ]


async def _copy_many(
    conn: db.Executor,
    schema: str,
    specs: Sequence[JobSpec],
    unique: list[tuple[int, tuple[Any, ...]]],
    rows: list[dict[str, Any]],
) -> list[EnqueueResult]:
    """The common bulk case (no idempotency keys, due now): COPY, several times faster than an
    INSERT."""
    fresh = _random_ids(len(rows))
    records = [
        (r["t"], r["q"], _payload(f"specs[{i}].payload", r["p"]), r["pr"], r["m"], r["c"] or new)
        for r, (i, _), new in zip(rows, unique, fresh, strict=True)
    ]
    columns = ["type", "queue", "payload", "priority", "max_retries", "correlation_id"]
    async with db.transaction(conn) as c:
        ids, now = await db.copy_jobs(c, schema, columns, records)
    return [
        EnqueueResult(
            _new_job(
                fields,
                specs[i],
                {"id": job_id, "correlation_id": record[5], "run_at": now, "created_at": now},
            ),
            True,
        )
        for (i, fields), job_id, record in zip(unique, ids, records, strict=True)
    ]


def _batch_json(rows: list[dict[str, Any]], positions: list[int]) -> str:
    """The whole batch as one JSON text; a payload that cannot be stored is found and named."""
    try:
        text = _ENCODER.encode(rows)
    except (TypeError, ValueError):
        text = None
    if text is None or "\\u0000" in text:
        for row, i in zip(rows, positions, strict=True):
            _payload(f"specs[{i}].payload", row["p"])
    assert text is not None
    return text


def _canonical(payload: Any, i: int) -> str:
    try:
        return json.dumps(payload, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"specs[{i}].payload", f"must be JSON-serialisable ({exc})") from exc


def _new_job(fields: tuple[Any, ...], spec: JobSpec, row: Any) -> Job:
    """The row just inserted, from the values sent and the few the database chose."""
    type_, queue, priority, max_retries, key, _correlation, _run_at, _delay = fields
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
        correlation_id=row["correlation_id"],
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
