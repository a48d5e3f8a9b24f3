"""Bulk actions over a filter: replay, cancel, delete or reschedule every job a
`JobFilter` matches, in bounded batches, each its own short transaction.

An action is a row of `bulk_actions` (migration 21). `create` counts the matching jobs and fixes
the set the action may touch (the filter, and ids up to the highest one at creation: jobs
enqueued later stay out). `run_batch` takes the action's row lock (SKIP LOCKED: two runners never
run one action at once), picks the next `batch` matching ids above its cursor, acts on them,
records each job's change (job_events; operator_log for a delete, whose job_events go with the
job) and moves the cursor and the counts forward, all in one transaction: a batch commits whole
or not at all, so an action whose runner was killed resumes after its last committed batch and
no job is handled twice.

Each action has one runner at a time (migration 29): a `Runner` in the background of `pgworker
serve` and of every console mounted in an application, the maintenance leader of the workers
(_maintenance/bulk.py), or `pgworker replay/cancel --filter` in the foreground (`run`). A runner
takes the actions that are free (never taken, or whose owner's lease lapsed: its process died) and
renews its lease with every batch; a batch runs only under its action's owner. So an action whose
runner was killed is adopted by another once its lease (LEASE, PGWORKER_BULK_LEASE) has passed,
and none stays running with nobody running it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio

from . import _validate as validate
from ._db.connection import Executor
from ._db.queries import Row, queries, transaction
from ._filters import JobFilter
from ._logs import get_logger
from ._redact import scrub
from .errors import PgWorkerError, ValidationError
from .models import DEFAULT_SCHEMA
from .operations import MAX_ACTOR_LENGTH, MAX_REASON_LENGTH, _announce, os_user

KINDS = ("replay", "cancel", "delete", "reschedule")
"""What a bulk action does to each job it matches: replay a failed or cancelled job, cancel a
pending or running one, delete a finished one, reschedule (set run_at of) a pending one."""
BATCH = 500
"""Jobs per batch (and transaction), unless PGWORKER_BULK_BATCH says otherwise."""
MAX_BATCH = 10_000
POLL = 2.0
"""Seconds between two looks of `Runner` for actions created elsewhere (or left running)."""
WAIT_LOCKED = 0.2
"""Seconds `run` waits before looking again at an action another runner holds."""
LEASE = 30.0
"""Seconds a runner holds an action past its last batch (or look for work), unless
PGWORKER_BULK_LEASE says otherwise: how long an action whose runner died waits to be adopted."""
MAX_LEASE = 3600.0
RUNNER_KINDS = ("console", "serve", "worker", "cli")
"""Who runs an action: a console mounted in an application, `pgworker serve`, the workers'
maintenance leader, or `pgworker replay/cancel --filter` in the foreground."""

_log = get_logger()


def batch_size() -> int:
    """PGWORKER_BULK_BATCH (1 to 10,000), else BATCH."""
    raw = os.environ.get("PGWORKER_BULK_BATCH", "").strip()
    if not raw:
        return BATCH
    try:
        value = validate.whole(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BATCH:
        raise ValidationError(
            "PGWORKER_BULK_BATCH", f"must be a whole number from 1 to {MAX_BATCH}, got {raw!r}"
        )
    return value


def lease() -> float:
    """PGWORKER_BULK_LEASE (seconds, 1 to 3600), else LEASE."""
    raw = os.environ.get("PGWORKER_BULK_LEASE", "").strip()
    if not raw:
        return LEASE
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 1 <= value <= MAX_LEASE:  # NaN too
        raise ValidationError(
            "PGWORKER_BULK_LEASE",
            f"must be a number of seconds from 1 to {MAX_LEASE:g}, got {raw!r}",
        )
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """A runner of bulk actions: its `id` (recorded in the actions it holds), its `kind` (one of
    RUNNER_KINDS) and the `lease`, in seconds, each of its batches and looks renews."""

    id: str
    kind: str
    lease: float = LEASE

    @classmethod
    def of(cls, kind: str, runner_id: str | None = None) -> Holder:
        """A holder of `kind`, named `runner_id` (default: kind, host, process and a random
        part), with the lease PGWORKER_BULK_LEASE sets."""
        if kind not in RUNNER_KINDS:
            raise ValidationError("kind", f"must be one of {', '.join(RUNNER_KINDS)}, got {kind!r}")
        if runner_id is None:
            from .settings import default_worker_id

            runner_id = f"{kind}-{default_worker_id()}"
        return cls(runner_id, kind, lease())


@dataclasses.dataclass(frozen=True, slots=True)
class BulkAction:
    """One bulk action and its progress: `matched` jobs when created, `done` of them handled,
    `skipped` left as they were (their status no longer fitted the action when their batch came),
    `state` running, done or failed (`error` says why)."""

    id: int
    kind: str
    filter: JobFilter
    run_at: datetime | None
    max_id: int
    matched: int
    done: int
    skipped: int
    cursor: int
    state: str
    error: str | None
    actor: str
    reason: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    runner: str | None = None
    """The id of the runner that holds it (None: never taken yet)."""
    runner_kind: str | None = None
    runner_since: datetime | None = None
    """Since when that runner holds it."""
    lease_until: datetime | None = None
    """Until when that runner holds it without a batch: another may adopt it after."""

    @classmethod
    def from_row(cls, row: Row) -> BulkAction:
        return cls(
            id=row["id"],
            kind=row["kind"],
            filter=JobFilter.parse(json.loads(row["filter"])),
            run_at=row["run_at"],
            max_id=row["max_id"],
            matched=row["matched"],
            done=row["done"],
            skipped=row["skipped"],
            cursor=row["cursor"],
            state=row["state"],
            error=row["error"],
            actor=row["actor"],
            reason=row["reason"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            runner=_column(row, "runner"),
            runner_kind=_column(row, "runner_kind"),
            runner_since=_column(row, "runner_since"),
            lease_until=_column(row, "lease_until"),
        )

    @property
    def running(self) -> bool:
        return self.state == "running"

    def as_json(self) -> dict[str, Any]:
        """The action as the HTTP API answers it (times in ISO 8601)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "filter": self.filter.as_json(),
            "run_at": None if self.run_at is None else self.run_at.isoformat(),
            "matched": self.matched,
            "done": self.done,
            "skipped": self.skipped,
            "status": self.state,
            "error": self.error,
            "actor": self.actor,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "runner": None
            if self.runner is None
            else {
                "id": self.runner,
                "kind": self.runner_kind,
                "since": None if self.runner_since is None else self.runner_since.isoformat(),
                "lease_until": None if self.lease_until is None else self.lease_until.isoformat(),
            },
        }


def _column(row: Row, name: str) -> Any:
    """A column some statements return and others do not (the runner's, migration 29)."""
    return row.get(name)


def _kind(value: object) -> str:
    if value not in KINDS:
        raise ValidationError("kind", f"must be one of {', '.join(KINDS)}, got {value!r}")
    return str(value)


async def count(
    conn: Executor,
    job_filter: JobFilter,
    *,
    max_id: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> tuple[int, int]:
    """The highest job id now (or `max_id`) and how many jobs up to it `job_filter` matches: what
    a confirmation states before `create`."""
    q = queries(validate.identifier("schema", schema))
    if max_id is not None:
        max_id = validate.count("max_id", max_id, minimum=0, maximum=validate.MAX_BIGINT)
    async with transaction(conn) as c:
        await q.plan_with_values(c)
        return await q.jobs_filtered_count(c, job_filter.params(), max_id)


async def create(
    conn: Executor,
    kind: str,
    job_filter: JobFilter,
    *,
    run_at: datetime | None = None,
    by: str | None = None,
    reason: str | None = None,
    max_id: int | None = None,
    holder: Holder | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> BulkAction:
    """A new action of `kind` over the jobs `job_filter` matches, up to the highest id now (or
    `max_id`, the one a confirmation counted to); it runs once a runner takes it (`run`, a
    `Runner`, the workers' maintenance leader), `holder` at once when given (the console or
    command that creates it). `run_at` (a timezone-aware datetime) for `reschedule` only, and
    required there. Recorded as done by `by` (default: the OS user) for `reason`. In the
    caller's transaction when `conn` is in one."""
    q = queries(validate.identifier("schema", schema))
    kind = _kind(kind)
    if not isinstance(job_filter, JobFilter):
        raise ValidationError("filter", f"must be a JobFilter, got {job_filter!r}")
    if kind == "reschedule":
        if run_at is None:
            raise ValidationError("run_at", "a reschedule needs the time to run at")
        run_at = validate.run_at(run_at)
    elif run_at is not None:
        raise ValidationError("run_at", f"goes with reschedule only, not {kind}")
    actor = validate.name("by", os_user() if by is None else by, MAX_ACTOR_LENGTH)
    reason = validate.name("reason", reason, MAX_REASON_LENGTH, required=False)
    if max_id is not None:
        max_id = validate.count("max_id", max_id, minimum=0, maximum=validate.MAX_BIGINT)
    async with transaction(conn) as c:
        await q.plan_with_values(c)
        bound, matched = await q.jobs_filtered_count(c, job_filter.params(), max_id)
        row = await q.bulk_action_create(
            c, kind, json.dumps(job_filter.as_json()), run_at, bound, matched, actor, reason
        )
        if holder is not None:
            await q.bulk_actions_claim(c, holder.id, holder.kind, holder.lease, row["id"])
            row = await q.bulk_action_get(c, row["id"]) or row
    action = BulkAction.from_row(row)
    _log.info(
        "bulk action created",
        action_id=action.id,
        kind=kind,
        matched=matched,
        filter=job_filter.as_json(),
        actor=actor,
        reason=reason,
    )
    return action


async def get(conn: Executor, action_id: int, *, schema: str = DEFAULT_SCHEMA) -> BulkAction | None:
    """The action and its progress, or None."""
    q = queries(validate.identifier("schema", schema))
    row = await q.bulk_action_get(
        conn, validate.count("id", action_id, minimum=1, maximum=validate.MAX_BIGINT)
    )
    return None if row is None else BulkAction.from_row(row)


STATES = ("running", "done", "failed")
"""The states of a bulk action."""


async def recent(
    conn: Executor,
    *,
    state: str | None = None,
    before: int | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[BulkAction]:
    """The actions newest first (of `state` only, when given), below the id `before`: what the
    console's actions page and GET /jobs/actions list."""
    q = queries(validate.identifier("schema", schema))
    if state is not None and state not in STATES:
        raise ValidationError("status", f"must be one of {', '.join(STATES)}, got {state!r}")
    if before is not None:
        before = validate.count("before", before, minimum=1, maximum=validate.MAX_BIGINT)
    limit = validate.count("limit", limit, minimum=1, maximum=MAX_BATCH)
    return [BulkAction.from_row(r) for r in await q.bulk_actions_list(conn, state, before, limit)]


async def run_batch(
    conn: Executor,
    action_id: int,
    *,
    batch: int | None = None,
    holder: Holder | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> BulkAction | None:
    """One batch of a running action, in one transaction, renewing `holder`'s lease on it; the
    action as it is after it. None when it is not running, when `holder` does not hold it
    (another runner took it over), or when another runner is running a batch of it now."""
    q = queries(validate.identifier("schema", schema))
    size = batch_size() if batch is None else validate.count("batch", batch, minimum=1)
    replayed: list[Any] = []
    async with transaction(conn) as c:
        row = await q.bulk_action_lock(
            c,
            action_id,
            None if holder is None else holder.id,
            LEASE if holder is None else holder.lease,
        )
        if row is None:
            return None
        action = BulkAction.from_row(row)
        await q.plan_with_values(c)
        ids = await q.bulk_batch_ids(c, action.filter.params(), action.cursor, action.max_id, size)
        changed = 0
        if ids:
            if action.kind == "replay":
                replayed = await q.jobs_replay(c, ids, action.actor, action.reason, action.id)
                changed = sum(1 for r in replayed if r["replayed"])
            elif action.kind == "cancel":
                changed = len(
                    await q.jobs_cancel_many(c, ids, action.actor, action.reason, action.id)
                )
            elif action.kind == "delete":
                changed = len(
                    await q.jobs_delete_many(c, ids, action.actor, action.reason, action.id)
                )
            else:
                assert action.run_at is not None
                changed = len(
                    await q.jobs_reschedule_many(
                        c, ids, action.run_at, action.actor, action.reason, action.id
                    )
                )
        finished = len(ids) < size
        await q.bulk_action_advance(
            c, action.id, ids[-1] if ids else action.cursor, changed, len(ids) - changed, finished
        )
        after = await q.bulk_action_get(c, action.id)
    _announce(replayed, action.actor, action.reason)
    assert after is not None
    done = BulkAction.from_row(after)
    if finished:
        _log.info(
            "bulk action done",
            action_id=done.id,
            kind=done.kind,
            matched=done.matched,
            done=done.done,
            skipped=done.skipped,
        )
    return done


async def fail(conn: Executor, action_id: int, error: str, *, schema: str = DEFAULT_SCHEMA) -> None:
    """Give the action up, saying why (its batches done so far stay done)."""
    q = queries(validate.identifier("schema", schema))
    await q.bulk_action_fail(conn, action_id, scrub(error)[:2000])


async def claim(
    conn: Executor, holder: Holder, *, action_id: int | None = None, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """The running actions `holder` holds now, oldest first, each lease renewed: those it held,
    those never taken, and those whose runner's lease lapsed (adopted, and logged so); only
    `action_id` when given."""
    q = queries(validate.identifier("schema", schema))
    rows = await q.bulk_actions_claim(conn, holder.id, holder.kind, holder.lease, action_id)
    for row in rows:
        if row["previous"] is not None and row["previous"] != holder.id:
            _log.warning(
                "bulk action adopted: its runner's lease lapsed",
                action_id=row["id"],
                runner=holder.id,
                previous=row["previous"],
            )
    return [row["id"] for row in rows]


async def release(conn: Executor, holder: Holder, *, schema: str = DEFAULT_SCHEMA) -> None:
    """`holder` stops: its running actions are left to the other runners at once."""
    await queries(validate.identifier("schema", schema)).bulk_actions_release(conn, holder.id)


async def step(
    conn: Executor,
    action_id: int,
    *,
    batch: int | None = None,
    holder: Holder | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> BulkAction | None:
    """`run_batch`, an action whose batch fails for a reason other than the database (a bug, a
    value it refuses) given up (state failed, `error` says why) and returned so; a database that
    does not answer is raised, the action left running for a later batch."""
    try:
        return await run_batch(conn, action_id, batch=batch, holder=holder, schema=schema)
    except (OSError, TimeoutError):
        raise
    except PgWorkerError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith("asyncpg") and _transient(exc):
            raise
        await fail(conn, action_id, f"{type(exc).__name__}: {exc}", schema=schema)
        return await get(conn, action_id, schema=schema)


async def run(
    conn: Executor,
    action_id: int,
    *,
    batch: int | None = None,
    progress: Callable[[BulkAction], Awaitable[None] | None] | None = None,
    holder: Holder | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> BulkAction:
    """Run the action's batches until it is no longer running; `progress` is called with the
    action after each batch. With a `holder`, the action is taken first (waited for while
    another runner holds it and renews its lease) and each batch runs under that holder; without
    one, batches run whoever holds it. A batch that fails for a reason other than the database
    gives the action up (`step`); a database that does not answer is raised, the action left
    running for a later run to resume."""
    while True:
        action = await step(conn, action_id, batch=batch, holder=holder, schema=schema)
        if action is None:
            if holder is not None and await claim(conn, holder, action_id=action_id, schema=schema):
                continue
            found = await get(conn, action_id, schema=schema)
            if found is None:
                raise ValidationError("id", f"there is no bulk action {action_id}")
            if not found.running:
                return found
            await anyio.sleep(WAIT_LOCKED)  # another runner holds it: look again
            continue
        if progress is not None:
            shown = progress(action)
            if shown is not None:
                await shown
        if not action.running:
            return action


def _transient(exc: BaseException) -> bool:
    """A database error that says nothing about the action (a connection lost, a lock wait
    given up, a serialization failure): try again later."""
    state = str(getattr(exc, "sqlstate", "") or "")
    return state[:2] in ("08", "40", "53", "57") or state == "55P03"


class Runner:
    """The actions a console runs in the background (`pgworker serve`'s, started by its
    lifespan, or a console mounted in an application, started at its first request): those it
    creates (`wake`), those never taken, and those whose runner died (its lease lapsed), one
    batch of each in turn, looking again every POLL seconds. Stopped (cancelled), it leaves the
    actions it held to the other runners at once."""

    def __init__(self, pool: Any, schema: str, holder: Holder, *, batch: int | None = None) -> None:
        self.pool = pool
        self.schema = schema
        self.holder = holder
        self.batch = batch_size() if batch is None else batch
        self._wake = anyio.Event()

    def wake(self) -> None:
        """An action was created: run it now rather than at the next look."""
        self._wake.set()

    async def serve(self) -> None:
        try:
            while not _closing(self.pool):
                self._wake = anyio.Event()
                try:
                    await self.round()
                except Exception as exc:  # the database went away: the next look tries again
                    if _closing(self.pool):
                        return
                    _log.warning("bulk actions: given up for now", error=scrub(str(exc)))
                with anyio.move_on_after(POLL):
                    await self._wake.wait()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                if not _closing(self.pool):
                    with contextlib.suppress(Exception):
                        await release(self.pool, self.holder, schema=self.schema)

    async def round(self) -> None:
        """Every action this runner holds or may take, a batch of each in turn, until none is
        left running; each look renews the leases of those it holds."""
        held = await claim(self.pool, self.holder, schema=self.schema)
        while held:
            for action_id in held:
                await step(
                    self.pool, action_id, batch=self.batch, holder=self.holder, schema=self.schema
                )
            held = await claim(self.pool, self.holder, schema=self.schema)


def _closing(pool: Any) -> bool:
    """Whether the pool is closed or closing (the application it was given by has stopped)."""
    closing = getattr(pool, "is_closing", None)
    return bool(closing()) if callable(closing) else False
