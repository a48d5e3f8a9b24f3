"""Enqueue: what services import. It validates everything before writing anything, and lets the
database's UNIQUE constraint decide idempotency."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from json.encoder import c_encode_basestring, c_make_encoder  # type: ignore[attr-defined]
from typing import Any, NamedTuple, TypeVar

import anyio
import anyio.lowlevel
import asyncpg

from . import _validate as validate
from ._attempt import current_correlation_id
from ._db.connection import Executor
from ._db.queries import Queries, queries, transaction
from ._drivers import NATIVE, UNUSABLE, adapt, connection_lost, is_adapter, unusable
from ._tracing import current_traceparent
from .errors import IdempotencyConflict, JobNotPending, PgWorkerError, ValidationError
from .models import (
    DEFAULT_SCHEMA,
    ENQUEUE_OPTIONS,
    EnqueueResult,
    Job,
    JobSpec,
    JobStatus,
)

T = TypeVar("T")
U = TypeVar("U")


def _name(at: int | None, field: str) -> str:
    """The field's name in an error: `payload` for enqueue, `specs[3].payload` for a batch."""
    return field if at is None else f"specs[{at}].{field}"


def _in_batch(exc: ValidationError, at: int | None) -> ValidationError:
    """`exc`, about a field of `specs[at]` when in a batch (its name is only built on error)."""
    if at is None:
        return exc
    message = str(exc)[len(exc.field) + 2 :]
    return ValidationError(_name(at, exc.field), message)


def _not_serialisable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The C encoder that json.dumps builds on every call, built once: compact, no NaN, UTF-8 kept.
_encode = c_make_encoder(
    None, _not_serialisable, c_encode_basestring, None, ":", ",", False, False, False
)


def _payload(at: int | None, value: Any) -> str:
    """The payload's JSON text, once sure that jsonb stores it and that it can be read back."""
    try:
        text = "".join(_encode(value, 0))
    except RecursionError:
        problem: str | None = f"must not nest lists and objects more than {validate.MAX_DEPTH} deep"
    except (TypeError, ValueError) as exc:
        raise ValidationError(_name(at, "payload"), f"must be JSON-serialisable ({exc})") from exc
    else:
        problem = validate.json_problem(text, value)
    if problem is not None:
        raise ValidationError(_name(at, "payload"), problem)
    return text


# Each option's validator, as EnqueueOptions declares it.
_check_queue = ENQUEUE_OPTIONS["queue"].check
_check_priority = ENQUEUE_OPTIONS["priority"].check
_check_max_retries = ENQUEUE_OPTIONS["max_retries"].check
_check_idempotency_key = ENQUEUE_OPTIONS["idempotency_key"].check
_check_correlation_id = ENQUEUE_OPTIONS["correlation_id"].check
_check_run_at = ENQUEUE_OPTIONS["run_at"].check
_check_delay = ENQUEUE_OPTIONS["delay"].check
_check_version = ENQUEUE_OPTIONS["version"].check
_check_concurrency_key = ENQUEUE_OPTIONS["concurrency_key"].check
_check_after = ENQUEUE_OPTIONS["after"].check
_check_on_parent_failure = ENQUEUE_OPTIONS["on_parent_failure"].check
_check_unique_key = ENQUEUE_OPTIONS["unique_key"].check
_check_unique_states = ENQUEUE_OPTIONS["unique_states"].check
_check_unique_period = ENQUEUE_OPTIONS["unique_period"].check
_check_replace = ENQUEUE_OPTIONS["replace"].check
# What a check makes of an option not given (None), computed once: most specs give few options,
# and a batch checks thousands. The other options' checks keep None.
_QUEUE_NOT_GIVEN = _check_queue(None)
_PRIORITY_NOT_GIVEN = _check_priority(None)
_VERSION_NOT_GIVEN = _check_version(None)


def _schedule(run_at: Any, delay: Any) -> tuple[datetime | None, float | None]:
    if run_at is None and delay is None:
        return None, None
    if run_at is not None and delay is not None:
        raise ValidationError("run_at", "give run_at or delay, not both")
    if run_at is not None:
        return _check_run_at(run_at), None
    return None, _check_delay(delay)


class _Fields(NamedTuple):
    """A spec's validated fields but its payload. `correlation_id` None: the database makes one."""

    type: str
    queue: str
    priority: int
    max_retries: int | None
    idempotency_key: str | None
    correlation_id: str | None
    run_at: datetime | None
    delay: float | None
    version: int
    concurrency_key: str | None
    after: tuple[int, ...] | None = None
    on_parent_failure: str | None = None
    unique_key: str | None = None
    unique_states: int | None = None  # the bitmask stored (see validate.unique_states)
    unique_period: float | None = None
    replace: bool = False


def _dependencies(
    spec: JobSpec, run_at: datetime | None, delay: float | None
) -> tuple[tuple[int, ...] | None, str | None]:
    """A spec's parents (ascending) and what a failed one does; None, None for a plain job."""
    after = _check_after(spec.after)
    if after is not None and (run_at is not None or delay is not None):
        raise ValidationError(
            "run_at" if run_at is not None else "delay",
            "a job with after= runs when its last parent ends: give after= or a schedule, not both",
        )
    return after, _check_on_parent_failure(spec.on_parent_failure, after)


def _fields(spec: JobSpec, at: int | None) -> _Fields:
    """Validate a spec's fields but its payload (the correlation id, when not given, is the
    running job's)."""
    try:
        run_at, delay = _schedule(spec.run_at, spec.delay)
        queue, priority, retries = spec.queue, spec.priority, spec.max_retries
        key, correlation, version = spec.idempotency_key, spec.correlation_id, spec.version
        concurrency = spec.concurrency_key
        if correlation is None:
            correlation = current_correlation_id.get()
        after: tuple[int, ...] | None = None
        on_failure: str | None = None
        if spec.after is not None or spec.on_parent_failure is not None:
            after, on_failure = _dependencies(spec, run_at, delay)
        return _Fields(
            validate.name("type", spec.type, validate.MAX_TYPE_LENGTH),
            _QUEUE_NOT_GIVEN if queue is None else _check_queue(queue),
            _PRIORITY_NOT_GIVEN if priority is None else _check_priority(priority),
            None if retries is None else _check_max_retries(retries),
            None if key is None else _check_idempotency_key(key),
            None if correlation is None else _check_correlation_id(correlation),
            run_at,
            delay,
            _VERSION_NOT_GIVEN if version is None else _check_version(version),
            None if concurrency is None else _check_concurrency_key(concurrency),
            after,
            on_failure,
            *_unique(spec),
        )
    except ValidationError as exc:
        raise _in_batch(exc, at) from None


def _unique(spec: JobSpec) -> tuple[str | None, int | None, float | None, bool]:
    """A spec's unique key, states (the bitmask), period and replace, checked together."""
    key = spec.unique_key
    if key is not None:
        key = _check_unique_key(key)
    replace = spec.replace
    if replace is not False:
        replace = _check_replace(replace)
    if key is None:
        if spec.unique_states is not None:
            raise ValidationError("unique_states", "needs a unique_key")
        if spec.unique_period is not None:
            raise ValidationError("unique_period", "needs a unique_key")
        if replace:
            raise ValidationError(
                "replace", "needs a unique_key (replace updates the pending job holding that key)"
            )
        return None, None, None, False
    if spec.after is not None:
        raise ValidationError(
            "unique_key",
            "give unique_key or after, not both: a job that runs after others cannot also be "
            "unique (enqueue the dependant once, e.g. from the code that enqueues its parents)",
        )
    if spec.idempotency_key is not None:
        raise ValidationError(
            "unique_key",
            'give idempotency_key or unique_key, not both (see "Unique jobs or idempotency keys" '
            "in the guide)",
        )
    period = _check_unique_period(spec.unique_period)
    return key, _check_unique_states(spec.unique_states, period), period, replace


def _result(row: Any, key: str | None) -> EnqueueResult:
    if not row["matches"]:
        raise IdempotencyConflict(key or "", row["id"])
    return EnqueueResult(None, row["created"], Job.from_record, (row,))


async def enqueue(
    conn: Executor | Any,
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
    version: int | None = None,
    concurrency_key: str | None = None,
    after: Sequence[int] | None = None,
    on_parent_failure: str | None = None,
    unique_key: str | None = None,
    unique_states: Sequence[str] | None = None,
    unique_period: timedelta | float | None = None,
    replace: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> EnqueueResult:
    """Insert one job and notify the workers of its queue. `version` is the payload's version
    (default 1): only workers whose task runs that version claim the job. `concurrency_key`
    (at most 200 characters) is what the task's `max_running_per_key` counts running jobs by.

    A payload of None (JSON null) is stored as `{}`, as by every other path. On a Connection
    inside a transaction, the job and its notification exist only if that transaction commits.
    With an idempotency key already used for the same type and payload (compared as JSON values:
    1 and 1.0 are the same), the existing job comes back with `created=False`; with another type
    or payload, IdempotencyConflict is raised and nothing is written. Queue, priority, schedule
    and concurrency_key are not part of the work: a later call giving other ones gets the
    existing job back, unchanged, not a conflict.

    With a `unique_key` (at most 200 characters): while a job of the same type and queue holding
    that key is in one of `unique_states` (default pending and running; they must hold both, and
    a final state needs `unique_period`) and, with `unique_period` seconds, was enqueued in the
    same period bucket (database time), that job comes back with `created=False`, whatever its
    payload; a unique index decides. `replace=True` gives a pending holder this payload,
    priority and run_at instead, and raises JobNotPending while it runs. Not with an
    idempotency_key (ValidationError). A connection that is closed, or whose
    transaction is aborted, raises DatabaseUnavailable or PgWorkerError saying what to do.

    `conn` may also be a psycopg AsyncConnection or a SQLAlchemy AsyncConnection or
    AsyncSession: the job is written in its transaction (see pgworker.sync for synchronous ones).
    """
    if conn.__class__ not in NATIVE:
        conn = adapt(conn)
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
        version,
        concurrency_key,
        after,
        on_parent_failure,
        unique_key,
        unique_states,
        unique_period,
        replace,
    )
    f = _fields(spec, None)
    text = _payload(None, spec.payload)
    q = queries(validate.identifier("schema", schema))
    try:
        if f.after is not None:
            return await _insert_after(conn, q, f, text, idempotency_key, None)
        if f.unique_key is not None:
            return await _insert_unique(conn, q, f, text)
        return await _insert(conn, q, f, text, idempotency_key)
    except PgWorkerError:
        raise
    except Exception as exc:
        error = _driver_error(conn, exc)
        if error is exc:
            raise
        raise error from exc


async def _insert(
    conn: Executor, q: Queries, f: _Fields, text: str, idempotency_key: str | None
) -> EnqueueResult:
    row = await q.job_insert(conn, *_columns(f, text))
    if row is None:
        row = await _holder(conn, q, f, text, idempotency_key)
    return _result(row, idempotency_key)


def _columns(f: _Fields, text: str) -> tuple[Any, ...]:
    """The arguments job_insert.sql and job_insert_after.sql share, in their order."""
    return (
        f.type,
        f.queue,
        text,
        f.priority,
        f.max_retries,
        f.idempotency_key,
        f.correlation_id,
        f.run_at,
        f.delay,
        f.version,
        current_traceparent(),
        f.concurrency_key,
    )


async def _holder(
    conn: Executor, q: Queries, f: _Fields, text: str, idempotency_key: str | None
) -> Any:
    """The job holding the idempotency key, committed by a concurrent enqueue after the insert's
    snapshot was taken (the insert then returned nothing)."""
    key = f.idempotency_key or ""
    row = (await q.job_get_by_keys(conn, [key], [f.type], [text])).get(key)
    if row is None:
        raise PgWorkerError(
            f"idempotency_key {idempotency_key!r}: the job holding it vanished during the "
            "enqueue; try again"
        )
    return row


UNKNOWN_PARENT = "no job has the id"
"""What the error of an `after=` naming a job that does not exist says (the HTTP API: a 404)."""
SELF_PARENT = "a job cannot run after itself"
"""What the error of an `after=` naming the job being enqueued says (the HTTP API: a 409)."""
_FINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
_DEADLOCK_TRIES = 3


async def _insert_after(
    conn: Executor, q: Queries, f: _Fields, text: str, idempotency_key: str | None, at: int | None
) -> EnqueueResult:
    """One job with parents, in a transaction (a savepoint inside the caller's): the parents
    are locked in id order and their latest statuses read, then the job is written waiting for
    those not ended. A deadlock with a worker finishing a batch of jobs (it locks them, then
    their dependants) rolls the savepoint back, which releases the locks, and tries again."""
    assert f.after is not None
    for tries in range(1, _DEADLOCK_TRIES + 1):
        try:
            async with transaction(conn) as c:
                return await _write_after(c, q, f, text, idempotency_key, at)
        except asyncpg.exceptions.DeadlockDetectedError:
            if tries == _DEADLOCK_TRIES:
                raise
    raise AssertionError("unreachable")


async def _write_after(
    c: Any, q: Queries, f: _Fields, text: str, idempotency_key: str | None, at: int | None
) -> EnqueueResult:
    assert f.after is not None
    statuses = await q.job_parents_lock(c, f.after)
    unknown = [i for i in f.after if i not in statuses]
    if unknown:
        shown = ", ".join(map(str, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
        raise ValidationError(
            _name(at, "after"), f"{UNKNOWN_PARENT} {shown}: give the ids of existing jobs"
        )
    left = sum(1 for i in f.after if statuses[i] not in _FINAL)
    cancelled = None
    if f.on_parent_failure == "cancel":
        failed = [i for i in f.after if statuses[i] in (JobStatus.FAILED, JobStatus.CANCELLED)]
        if failed:
            cancelled = f"ParentFailed: parent {failed[0]} {statuses[failed[0]]}"
    row = await q.job_insert_after(
        c, *_columns(f, text), list(f.after), left, f.on_parent_failure, cancelled
    )
    if row is None:
        row = await _holder(c, q, f, text, idempotency_key)
    if not row["created"] and row["id"] in statuses:
        raise ValidationError(
            _name(at, "after"),
            f"lists job {row['id']}, which is this job (its idempotency_key "
            f"{idempotency_key!r} returns it): {SELF_PARENT}",
        )
    return _result(row, idempotency_key)


UNIQUE_TRIES = 10
"""How often an enqueue with a unique key runs its statement again when the job holding the key
changed under it (committed after the statement's snapshot, or left its states in between)."""


async def _insert_unique(conn: Executor, q: Queries, f: _Fields, text: str) -> EnqueueResult:
    """Insert a job with a unique key, or return (with `replace`: update) the live job holding
    it. The unique index decides; a race with the holder is run again, a bounded number of
    times."""
    for _ in range(UNIQUE_TRIES):
        row = await q.job_insert_unique(
            conn,
            f.type,
            f.queue,
            text,
            f.priority,
            f.max_retries,
            f.correlation_id,
            f.run_at,
            f.delay,
            f.version,
            current_traceparent(),
            f.unique_key,
            f.unique_states,
            f.unique_period,
            f.concurrency_key,
        )
        if row is None:
            continue
        if row["created"] or not f.replace:
            return EnqueueResult(None, row["created"], Job.from_record, (row,))
        changed = await q.job_unique_replace(conn, row["id"], text, f.priority, f.run_at, f.delay)
        if changed is not None:
            return EnqueueResult(None, False, Job.from_record, (changed,))
        if row["status"] == JobStatus.RUNNING:
            raise JobNotPending(
                f"unique_key {f.unique_key!r} is held by job {row['id']}, which is running: "
                "replace only changes a pending job; nothing was changed",
                row["id"],
                row["status"],
            )
        # The holder started or ended since it was read: look again.
    raise PgWorkerError(
        f"unique_key {f.unique_key!r}: the job holding it kept changing during the enqueue; "
        "try again"
    )


async def enqueue_many(
    conn: Executor | Any, specs: Sequence[JobSpec], *, schema: str = DEFAULT_SCHEMA
) -> list[EnqueueResult]:
    """Insert many jobs in one transaction (a savepoint inside the caller's): COPY when no spec
    has an idempotency key, a unique key or a schedule, else one INSERT (and one statement per
    spec with a unique key, as `enqueue` does: a later spec with the same key gets the job of
    the earlier one, created=False). Results come in the order of `specs`.
    Any invalid spec or idempotency conflict raises before anything is kept. `conn` is what
    `enqueue` takes; another driver's connection always gets the INSERT. A batch in which any
    spec has `after=` is written one job at a time, in one transaction (its parents must exist
    before the call)."""
    if conn.__class__ not in NATIVE:
        conn = adapt(conn)
    plain = True
    keyed = linked = unique = False
    for i, spec in enumerate(specs):
        if not isinstance(spec, JobSpec):
            raise ValidationError(f"specs[{i}]", f"must be a pgworker.JobSpec, got {spec!r}")
        if spec.idempotency_key is not None or spec.run_at is not None or spec.delay is not None:
            plain = False
        if spec.concurrency_key is not None:
            keyed = True
        if spec.after is not None or spec.on_parent_failure is not None:
            linked = True
        if spec.unique_key is not None or spec.replace:
            unique = True
    if not specs:
        return []
    q = queries(validate.identifier("schema", schema))
    try:
        if linked:
            return await _insert_linked(conn, q, specs)
        if unique:
            return await _unique_many(conn, q, specs)
        if plain and not is_adapter(conn):
            return await _copy_many(conn, q, specs, keyed)
        return await _insert_many(conn, q, specs)
    except PgWorkerError:
        raise
    except Exception as exc:
        error = _driver_error(conn, exc)
        if error is exc:
            raise
        raise error from exc


def _driver_error(conn: Any, exc: Exception) -> Exception:
    """A driver's error on the enqueue path as pgworker's, saying what to do: a connection lost
    or closed (DatabaseUnavailable), an aborted transaction; else `exc` itself, raised as it
    is."""
    error = unusable(conn, exc) if isinstance(exc, UNUSABLE) else None
    return error or connection_lost(conn, exc) or exc


async def _insert_linked(
    conn: Executor, q: Queries, specs: Sequence[JobSpec]
) -> list[EnqueueResult]:
    """enqueue_many for a batch with after=: every spec is checked first, then each is written
    on its own, in order, in one transaction (the jobs with parents lock them one job at a
    time; a spec may name as a parent a job of the same batch only by an id known before)."""
    checked = []
    for i, spec in enumerate(specs):
        fields = _fields(spec, i)
        checked.append((fields, _payload(i, {} if spec.payload is None else spec.payload)))
    results = []
    async with transaction(conn) as c:
        for i, (fields, text) in enumerate(checked):
            key = fields.idempotency_key
            if fields.after is not None:
                results.append(await _write_after(c, q, fields, text, key, i))
            elif fields.unique_key is not None:
                try:
                    results.append(await _insert_unique(c, q, fields, text))
                except JobNotPending as exc:
                    raise JobNotPending(f"specs[{i}]: {exc}", exc.job_id, exc.status) from None
            else:
                results.append(await _insert(c, q, fields, text, key))
    return results


async def _unique_many(conn: Executor, q: Queries, specs: Sequence[JobSpec]) -> list[EnqueueResult]:
    """A batch holding specs with a unique key: those go one statement each (a unique index
    cannot be the arbiter of the batch's INSERT beside the idempotency key's), the others in
    one INSERT, all in one transaction. Every spec is checked before anything is written."""
    checked = [
        (_fields(spec, i), _payload(i, {} if spec.payload is None else spec.payload))
        for i, spec in enumerate(specs)
    ]
    others = [i for i, (f, _) in enumerate(checked) if f.unique_key is None]
    results: list[EnqueueResult | None] = [None] * len(specs)
    async with transaction(conn) as c:
        if others:
            done = await _insert_many(c, q, [specs[i] for i in others])
            for i, result in zip(others, done, strict=True):
                results[i] = result
        for i, (f, text) in enumerate(checked):
            if f.unique_key is not None:
                try:
                    results[i] = await _insert_unique(c, q, f, text)
                except JobNotPending as exc:
                    raise JobNotPending(f"specs[{i}]: {exc}", exc.job_id, exc.status) from None
    return [r for r in results if r is not None]


async def _insert_many(conn: Executor, q: Queries, specs: Sequence[JobSpec]) -> list[EnqueueResult]:
    """enqueue_many's one INSERT, for batches with idempotency keys or schedules."""
    unique: list[tuple[int, _Fields]] = []  # (index in specs, validated fields)
    texts: list[str] = []  # the payloads of `unique` as JSON
    payloads: list[Any] = []  # the payloads of `unique`, None made {}
    first_of_key: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for i, spec in enumerate(specs):
        fields = _fields(spec, i)
        payload = {} if spec.payload is None else spec.payload
        text = _payload(i, payload)
        key = fields.idempotency_key
        if key is not None:
            if key in first_of_key:
                j = first_of_key[key]
                same_payload = _json_value(texts[j]) == _json_value(text)
                if unique[j][1].type != fields.type or not same_payload:
                    raise IdempotencyConflict(key, None)
                repeats[i] = j
                continue
            first_of_key[key] = len(unique)
        unique.append((i, fields))
        texts.append(text)
        payloads.append(payload)
    batch = _batch_json(unique, texts)
    traceparent = current_traceparent()
    async with transaction(conn) as c:
        inserted = {r["ord"] - 1: r for r in await q.job_insert_many(c, batch, traceparent)}
        taken = [n for n in range(len(unique)) if n not in inserted]
        existing = {}
        if taken:
            existing = await q.job_get_by_keys(
                c,
                [unique[n][1].idempotency_key or "" for n in taken],
                [unique[n][1].type for n in taken],
                [texts[n] for n in taken],
            )
        unique_results = []
        for n, (i, fields) in enumerate(unique):
            row = inserted.get(n)
            if row is not None:
                unique_results.append(
                    EnqueueResult.later(
                        _new_job,
                        fields,
                        payloads[n],
                        row["id"],
                        row["correlation_id"],
                        row["run_at"],
                        row["created_at"],
                        traceparent,
                    )
                )
                continue
            row = existing.get(fields.idempotency_key or "")
            if row is None:
                raise PgWorkerError(
                    f"specs[{i}]: idempotency_key {fields.idempotency_key!r}: the job holding it "
                    "vanished during the enqueue; try again"
                )
            unique_results.append(_result(row, fields.idempotency_key))
    results: list[EnqueueResult] = []
    u = iter(unique_results)
    for i in range(len(specs)):
        if i in repeats:
            results.append(EnqueueResult(unique_results[repeats[i]].job, False))
        else:
            results.append(next(u))
    return results


def _random_ids(n: int) -> list[str]:
    """n random UUID-shaped correlation ids (32 random hex digits each), from one read of the
    random source: its hex text, 36 characters an id, with four of them made dashes by slice
    assignments in C rather than formatted one id at a time."""
    text = bytearray(os.urandom(18 * n).hex(), "ascii")
    dashes = b"-" * n
    text[8::36] = text[13::36] = text[18::36] = text[23::36] = dashes
    ids = text.decode()
    return [ids[k : k + 36] for k in range(0, 36 * n, 36)]


_COPY_COLUMNS = [
    "id",
    "type",
    "queue",
    "payload",
    "priority",
    "max_retries",
    "version",
    "correlation_id",
]
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_CHUNK = 500


def _copy_text(value: str) -> str:
    """`value` as a field of COPY's text format."""
    return value.translate(_COPY_ESCAPES)


async def _copy_many(
    conn: Executor, q: Queries, specs: Sequence[JobSpec], keyed: bool
) -> list[EnqueueResult]:
    """The common bulk case (no idempotency keys, due now): COPY, several times faster than an
    INSERT. Ids are taken from the sequence first, so that the results can carry them. The
    concurrency_key column is sent only when a spec has one (`keyed`): other batches' lines stay
    as short. Specs are checked and encoded a chunk at a time while the server writes the chunk
    before: the two overlap. An invalid spec ends the COPY early and its error is raised inside
    the transaction, which rolls back what was written."""
    results: list[EnqueueResult] = []
    invalid: list[ValidationError] = []
    # Specs with only a type and a payload share their validated fields and the text around
    # the payload in their COPY line: (fields, text before the payload, text after it).
    bare: dict[str, tuple[_Fields, str, str]] = {}

    def shape_of(spec: JobSpec, i: int) -> tuple[_Fields, str, str]:
        f = _fields(spec, i)
        max_retries = r"\N" if f.max_retries is None else f.max_retries
        head = f"{_copy_text(f.type)}\t{_copy_text(f.queue)}\t"
        tail = f"\t{f.priority}\t{max_retries}\t{f.version}\t"
        if keyed:
            key = r"\N" if f.concurrency_key is None else _copy_text(f.concurrency_key)
            tail = f"{tail}{key}\t"
        return f, head, tail

    def encode(start: int, end: int) -> list[tuple[str, _Fields, str, Any]]:
        """Check and encode specs[start:end]: each row's COPY line but its id, and what its
        result needs (fields, correlation id, payload)."""
        rows = []
        fresh = _random_ids(end - start)
        for i in range(start, end):
            spec = specs[i]
            if (
                type(spec.type) is str
                and spec.queue is None
                and spec.priority is None
                and spec.max_retries is None
                and spec.correlation_id is None
                and spec.version is None
                and spec.concurrency_key is None
            ):
                shape = bare.get(spec.type)
                if shape is None:
                    shape = bare[spec.type] = shape_of(spec, i)
            else:
                shape = shape_of(spec, i)
            f, head, tail = shape
            payload = {} if spec.payload is None else spec.payload
            encoded = _payload(i, payload)
            if "\\" in encoded:  # JSON text escapes tabs and newlines itself
                encoded = encoded.replace("\\", "\\\\")
            correlation = f.correlation_id
            if correlation is None:
                correlation = field = fresh[i - start]
            else:
                field = _copy_text(correlation)
            rows.append((f"{head}{encoded}{tail}{field}{last}", f, correlation, payload))
        return rows

    def numbered(start: int, rows: list[Any], ids: list[str], now: datetime) -> bytes:
        lines = []
        for job_id, (line, f, correlation, payload) in zip(
            ids[start : start + len(rows)], rows, strict=True
        ):
            lines.append(f"{job_id}\t{line}")
            results.append(
                EnqueueResult.later(
                    _new_job, f, payload, job_id, correlation, now, now, traceparent
                )
            )
        return "".join(lines).encode()

    def first_chunk() -> list[Any]:
        try:
            return encode(0, min(_COPY_CHUNK, len(specs)))
        except ValidationError as exc:
            invalid.append(exc)
            return []

    async def chunks(first: list[Any], ids: list[str], now: datetime) -> AsyncIterator[bytes]:
        yield numbered(0, first, ids, now)
        for start in range(_COPY_CHUNK, len(specs), _COPY_CHUNK):
            try:
                rows = encode(start, min(start + _COPY_CHUNK, len(specs)))
            except ValidationError as exc:
                # Raising here would make asyncpg abort COPY with a cancel request that could
                # reach a later statement: end the COPY cleanly and raise after it.
                invalid.append(exc)
                return
            yield numbered(start, rows, ids, now)

    traceparent = current_traceparent()
    # A traceparent is the same for every row (and needs no escaping): a last column, or none.
    columns, last = _COPY_COLUMNS, "\n"
    if keyed:  # in the order of a line: the key after the version, before the correlation id
        columns = [*_COPY_COLUMNS[:-1], "concurrency_key", "correlation_id"]
    if traceparent is not None:
        columns, last = [*columns, "traceparent"], f"\t{traceparent}\n"
    async with transaction(conn) as c:
        # The ids are asked for first; the first chunk is encoded while the server makes them.
        (ids, now), first = await _concurrently(q.job_ids_reserve(c, len(specs)), first_chunk)
        if invalid:
            raise invalid[0]
        await q.jobs_copy(c, columns, chunks(first, ids, now))
        if invalid:
            raise invalid[0]
    return results


async def _concurrently(query: Awaitable[T], work: Callable[[], U]) -> tuple[T, U]:
    """Run `work` (plain code) while `query` waits on the server: the query is sent first."""
    answer: list[T] = []

    async def ask() -> None:
        answer.append(await query)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await anyio.lowlevel.checkpoint()  # `ask` runs until its query is sent
            done = work()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return answer[0], done


# Each row's payload while the batch is encoded: a JSON string of NUL, which no validated field
# holds, replaced afterwards by the payload's own JSON text.
_SLOT = "\x00"
_SLOT_JSON = '"\\u0000"'


def _batch_json(unique: list[tuple[int, _Fields]], texts: list[str]) -> str:
    """The whole batch as one JSON text (see job_insert_many.sql), from the validated fields and
    the payloads' JSON texts: one encoding of the rows, whatever the payloads."""
    rows = [
        {
            "p": _SLOT,
            "t": f.type,
            "q": f.queue,
            "pr": f.priority,
            "m": f.max_retries,
            "k": f.idempotency_key,
            "c": f.correlation_id,
            "r": f.run_at.isoformat() if f.run_at else None,
            "d": f.delay,
            "v": f.version,
            "ck": f.concurrency_key,
        }
        for _, f in unique
    ]
    parts = "".join(_encode(rows, 0)).split(_SLOT_JSON)
    spliced = parts + texts
    spliced[::2] = parts
    spliced[1::2] = texts
    return "".join(spliced)


def _number(text: str) -> tuple[str, Decimal]:
    return ("number", Decimal(text))


def _json_value(text: str) -> Any:
    """A payload's JSON text as a value that compares as jsonb's `=` does (migration 10's
    same_work): numbers by value (1 = 1.0 = 1e0, exactly, however large) and never equal to
    true or false, objects whatever the order of their keys. A batch's repeated key compares
    its payloads so."""
    return json.loads(text, parse_int=_number, parse_float=_number)


def _new_job(
    f: _Fields,
    payload: Any,
    job_id: int | str,
    correlation_id: str,
    run_at: datetime,
    created_at: datetime,
    traceparent: str | None = None,
) -> Job:
    """A job just inserted, from the values sent and the few the database chose. COPY's ids
    come as text: made ints here, for the jobs that are read."""
    return Job(
        id=int(job_id),
        type=f.type,
        queue=f.queue,
        payload=payload,
        priority=f.priority,
        status=JobStatus.PENDING,
        retry_count=0,
        max_retries=f.max_retries,
        attempts=0,
        idempotency_key=f.idempotency_key,
        correlation_id=correlation_id,
        run_at=run_at,
        claimed_at=None,
        worker_id=None,
        lease_expires_at=None,
        error=None,
        progress=None,
        result=None,
        created_at=created_at,
        updated_at=created_at,
        finished_at=None,
        version=f.version,
        traceparent=traceparent,
        concurrency_key=f.concurrency_key,
        unique_key=f.unique_key,
    )


def _actor(by: str | None) -> str:
    """Who changes a job: `by`, else the OS user running the process."""
    if by is None:
        try:
            by = getpass.getuser()
        except Exception:  # no name for this uid (a container without a passwd entry)
            by = "unknown"
    return validate.name("by", by, 200)


async def update_job(
    conn: Executor,
    job_id: int,
    *,
    run_at: datetime | None = None,
    priority: int | str | None = None,
    payload: Any = None,
    by: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> Job:
    """Change a job still `pending`: reschedule it (`run_at`, a timezone-aware datetime),
    reprioritise it (`priority`, an int or a label) or give it a new `payload`, each checked as
    `enqueue` checks it; None leaves a field as it is, and at least one must be given. Returns
    the job as it is now. The change is recorded in `job_events` (kind `updated`, actor `by`,
    default the OS user) and the workers of its queue are woken.

    Refused, with nothing changed: a job that runs or ended (JobNotPending), a `run_at` for a
    parked job (run_at infinity: it waits for its parents or for an event; ValidationError
    naming `run_at`), an unknown id (ValidationError naming `job_id`)."""
    q = queries(validate.identifier("schema", schema))
    job_id = validate.count("job_id", job_id, minimum=1, maximum=validate.MAX_BIGINT)
    if run_at is None and priority is None and payload is None:
        raise ValidationError("fields", "give at least one of run_at, priority, payload to change")
    when = None if run_at is None else validate.run_at(run_at)
    prio = None if priority is None else validate.priority("priority", priority)
    text = None if payload is None else _payload(None, payload)
    actor = _actor(by)
    row = await q.job_update(conn, job_id, when, prio, text, actor)
    if row is None:
        raise ValidationError("job_id", f"there is no job {job_id}")
    if not row["changed"]:
        if row["previous"] != JobStatus.PENDING:
            raise JobNotPending(
                f"job {job_id} is {row['previous']}: only a pending job can be updated; "
                "nothing was changed",
                job_id,
                row["previous"],
            )
        raise ValidationError(
            "run_at",
            f"job {job_id} is parked (run_at infinity: it waits for its parents or for an "
            "event), so its run_at cannot be set; change its priority or payload only. Nothing "
            "was changed",
        )
    return Job.from_record(row)
