"""Maintenance: what the leader does (see _leadership.py). At each tick it rescues the jobs whose
lease expired (their worker died, froze or was cut off) and, now and then, forgets workers long
gone and deletes the finished jobs past their retention. A rescued job is retried under the same
rule as a failed attempt (`retry.next_retry`, with its task's policy), so it waits for its
backoff; out of retries, it fails.

Retention (Settings.retain_completed, retain_failed) deletes old finished jobs with everything
recorded about them, at most RETENTION_BATCH per statement and RETENTION_BATCHES statements per
tick: a backlog (the first run on an old database) drains over the following ticks, each short,
never holding many locks, and never delaying the rescue by more than a tick.

Every statement runs on the connection the worker's outcome writes use (SharedConnection), which
it gives back between statements: a batch is small enough (PAGE, RETENTION_BATCH) that an
outcome write never waits behind one for more than a few milliseconds, and a backlog is worked
through in more statements per tick rather than larger ones.

It also keeps the console charts' per-minute rollup (migration 24, sql/queries/stats_rollup.sql):
every ROLLUP_EVERY ticks (each tick while behind), one statement per minute, at most
ROLLUP_MINUTES minutes per tick: the minutes closed since the last rolled up, newest first, then
those to roll up again. Nothing is added to the claim or the outcome writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

from .._db.connection import SharedConnection, classify, recover
from .._db.queries import AttemptKey, Row, queries
from .._logs import get_logger
from .._redact import describe
from .._runtime.leadership import Leadership
from ..registry import Registry
from ..retry import RetryPolicy, next_retry
from ..settings import Settings

if TYPE_CHECKING:
    from .._runtime.metrics import Metrics

WORKERS_FORGOTTEN_AFTER = 24 * 3600.0
PRUNE_EVERY = 60
LIMITS_PRUNE_BATCH = 10_000
"""The most rate windows forgotten at each prune (limits_prune.sql)."""
EVENTS_PRUNE_BATCH = 10_000
"""The most events (pgworker.emit) forgotten at each prune (events_prune.sql): those older than
the longest retention of finished jobs."""
REFUSED_KEPT = 1000
"""How many jobs the database refused to rescue are remembered and left out (tried again every
PRUNE_EVERY ticks: what refused them may have been fixed)."""
PAGE = 250
"""The most jobs jobs_expired.sql returns at once, and one rescue statement writes."""
RESCUE_PAGES = 4
"""The most pages of expired jobs rescued per tick; fewer once half the tick's interval is
spent."""
RETENTION_BATCH = 250
"""The most jobs one retention statement deletes (with their records: 5 ms, against 16 ms and
up to 55 for 1,000 at once)."""
RETENTION_BATCHES = 40
"""The most retention statements per tick; fewer once half the tick's interval is spent."""
GAUGES_SHARE = 20
"""With metrics on, the queue gauges are refreshed at each tick, unless their query took more
than 1/GAUGES_SHARE of the time since the last: then later, so that on a huge table their
count never costs the database more than that share."""

ROLLUP_EVERY = 6
"""The rollup runs every this many ticks (about 30 s), each tick while minutes wait."""
ROLLUP_MINUTES = 60
"""The most minutes rolled up per tick; fewer once half the tick's interval is spent."""
ROLLUP_SETTLE = 60.0
"""Seconds after its end before a minute is rolled up: its attempts and jobs carry their
transaction's start time, and commit a little later."""
ROLLUP_RECHECK = 600.0
"""A minute is rolled up again once, this many seconds after its end, for jobs enqueued by a
transaction that began in it and committed after its first rollup."""
ROLLUP_REACH = 86400.0
"""How far back minutes are rolled up: the longest chart (a day)."""
STATS_PRUNE_BATCH = 1440
"""The most minutes of rollup forgotten at each prune, those older than the longest retention
of finished jobs (and a day at least)."""

Decision = tuple[AttemptKey, str, float, int]
"""(attempt, next status, seconds until it runs again, 1 when counted as a retry)."""


def interval(lease: float) -> float:
    """The leadership is renewed and expired leases looked for every half lease, at most every
    5 s."""
    return min(lease / 2, 5.0)


def refused(exc: BaseException) -> bool:
    """Whether the database refused the rescue for what the rows are or set off: the values, or
    a trigger of the user's (whatever it raises: a refusal, a privilege it lacks, a table it
    needs that is gone). A lost connection or a statement to retry is no refusal."""
    kind = classify(exc)
    return kind == "rejected" or (kind == "unexpected" and isinstance(exc, asyncpg.PostgresError))


def retention_ages(settings: Settings) -> dict[str, float]:
    """The age past which each finished status is deleted; a status kept forever is absent."""
    ages: dict[str, float] = {}
    if settings.retain_completed is not None:
        ages["completed"] = settings.retain_completed
    if settings.retain_failed is not None:
        ages["failed"] = ages["cancelled"] = settings.retain_failed
    return ages


class Maintenance:
    name = "maintenance"

    def __init__(
        self,
        pool: Any,
        settings: Settings,
        registry: Registry | None = None,
        stopping: Callable[[], bool] = lambda: False,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        self._gauges_due = 0.0
        self._s = settings
        self._q = queries(settings.schema)
        self._registry = registry
        self._stopping = stopping
        self._log = get_logger(worker_id=settings.worker_id)
        self._ticks = 0
        self._refused: list[int] = []
        self._after: tuple[Any, int] | None = None
        self._ages = retention_ages(settings)
        self._backlog = False
        self._rollup_behind = True
        self.leadership = Leadership(pool, settings)
        self.rescued = 0

    @property
    def leading(self) -> bool:
        return self.leadership.leading

    def done(self) -> bool:
        return False

    async def reset(self, exc: Exception) -> None:
        if isinstance(self._pool, SharedConnection):
            await self._pool.drop()
        await recover(self._pool, exc)
        self.leadership.uncertain()
        self._clear_gauges()

    async def idle(self) -> None:
        await anyio.sleep(interval(self._s.lease))

    async def step(self) -> None:
        if self._stopping():
            # A stopping worker (draining its jobs) leaves maintenance to the others at once.
            await self.resign()
            return
        if not await self.leadership.renew():
            self._clear_gauges()
            return
        budget = anyio.current_time() + interval(self._s.lease) / 2
        for _ in range(RESCUE_PAGES):
            if not await self._rescue_page() or anyio.current_time() > budget:
                break
        now_and_then = self._ticks % PRUNE_EVERY == 0
        if now_and_then:
            await self._q.workers_prune(self._pool, WORKERS_FORGOTTEN_AFTER)
            await self._q.limits_prune(self._pool, LIMITS_PRUNE_BATCH)
            if self._ages:  # events live as long as the finished jobs kept the longest
                await self._q.events_prune(self._pool, max(self._ages.values()), EVENTS_PRUNE_BATCH)
                kept = max(max(self._ages.values()), ROLLUP_REACH)
                await self._q.stats_prune(self._pool, kept, STATS_PRUNE_BATCH)
            if self._ticks:
                self._refused.clear()
        rollup_due = self._ticks % ROLLUP_EVERY == 0 or self._rollup_behind
        self._ticks += 1
        if self._ages and (now_and_then or self._backlog):
            await self._retain()
        if rollup_due:
            await self.roll_up()
        if self._metrics is not None and anyio.current_time() >= self._gauges_due:
            await self._refresh_gauges(self._metrics)

    async def _rescue_page(self) -> bool:
        """Rescue one page of expired jobs; True when the page was full (more may wait)."""
        expired = await self._q.jobs_expired(self._pool, self._refused, self._after)
        # A full page: the next goes on after it, so that jobs the rescue leaves (refused,
        # locked) never hide those behind them; a short one: back to the oldest next time.
        last = expired[-1] if len(expired) >= PAGE else None
        self._after = None if last is None else (last["lease_expires_at"], last["id"])
        decided = [self._decide(row) for row in expired]
        if decided:
            rescued = await self._rescue(decided)
            if self._metrics is not None:
                labels = {row["id"]: (row["queue"], row["type"]) for row in expired}
                self._metrics.lost(labels[row["id"]] for row in rescued)
            for row in rescued:
                self.rescued += 1
                self._log.warning(
                    "job rescued: its worker stopped renewing the lease",
                    job_id=row["id"],
                    attempt=row["attempts"],
                    correlation_id=row["correlation_id"],
                    status=row["status"],
                    run_at=row["run_at"].isoformat(),
                    lost_worker=row["worker_id"],
                )
        return last is not None

    async def _refresh_gauges(self, metrics: Metrics) -> None:
        from .._runtime.metrics import MAX_QUEUES

        started = anyio.current_time()
        rows = await self._q.metrics_queues(self._pool, MAX_QUEUES)
        if self.leadership.leading:
            metrics.queues(rows)
        took = anyio.current_time() - started
        self._gauges_due = started + took * GAUGES_SHARE

    def _clear_gauges(self) -> None:
        """Only the elected worker shows the queue gauges."""
        if self._metrics is not None:
            self._metrics.queues(None)

    async def _retain(self) -> None:
        """Delete a few batches of finished jobs past their retention, fenced by the leadership.
        Until a batch comes back short, a backlog is left for the next tick (a lost connection
        included)."""
        pruned: dict[str, int] = {}
        budget = anyio.current_time() + interval(self._s.lease) / 2
        self._backlog = True
        for _ in range(RETENTION_BATCHES):
            try:
                batch = await self._q.jobs_prune(
                    self._pool, self._ages, RETENTION_BATCH, self._s.worker_id
                )
            except Exception as exc:
                if not refused(exc):
                    raise
                # A trigger of the user's own refusing the delete: said once per try (every
                # PRUNE_EVERY ticks); the rescue goes on meanwhile.
                self._log.error("retention refused by the database", error=describe(exc))
                self._backlog = False
                break
            for status, n in batch.items():
                pruned[status] = pruned.get(status, 0) + n
            if sum(batch.values()) < RETENTION_BATCH:
                self._backlog = False
                break
            if anyio.current_time() > budget:
                break
        if pruned:
            self._log.info(
                "pruned finished jobs past their retention", **pruned, backlog=self._backlog
            )

    async def roll_up(self) -> int:
        """Roll up (again) the minutes due, a statement each, fenced by the leadership; how many.
        Minutes left for lack of time are rolled up at the next tick."""
        budget = anyio.current_time() + interval(self._s.lease) / 2
        if self._rollup_behind:
            await self._q.stats_rollup_empty(
                self._pool, self._s.worker_id, ROLLUP_REACH, ROLLUP_RECHECK
            )
        due = await self._q.stats_rollup_due(
            self._pool, ROLLUP_SETTLE, ROLLUP_RECHECK, ROLLUP_REACH, ROLLUP_MINUTES
        )
        self._rollup_behind = len(due) >= ROLLUP_MINUTES
        done = 0
        for minute in due:
            if anyio.current_time() > budget:
                self._rollup_behind = True
                break
            try:
                await self._q.stats_rollup(self._pool, minute, self._s.worker_id)
            except Exception as exc:
                if not refused(exc):
                    raise
                # A privilege the worker lacks on the rollup's tables: said at each try (every
                # ROLLUP_EVERY ticks); rescue and retention go on, the charts read job_attempts.
                self._log.error("charts rollup refused by the database", error=describe(exc))
                self._rollup_behind = False
                break
            done += 1
        return done

    def _policy(self, type_: str) -> RetryPolicy:
        """The retry policy of the job's task, when this worker serves it; else the default."""
        if self._registry is not None and type_ in self._registry:
            return self._registry[type_].retry
        return RetryPolicy()

    def _decide(self, row: Row) -> Decision:
        key = (row["id"], row["attempts"], row["claimed_at"])
        delay = next_retry(
            self._policy(row["type"]),
            row["retry_count"],
            row["max_retries"],
            elapsed=row["elapsed"],
        )
        if delay is None:
            return key, "failed", 0.0, 0
        return key, "pending", delay, 1

    async def _rescue(self, decided: Sequence[Decision]) -> list[Row]:
        try:
            return await self._q.jobs_rescue(self._pool, self._s.worker_id, decided)
        except Exception as exc:
            if not refused(exc):
                raise
            return await self._rescue_one_by_one(decided, exc)

    async def _rescue_one_by_one(
        self, decided: Sequence[Decision], refusal: Exception
    ) -> list[Row]:
        """The database refused the rescue of a batch (a trigger of the user's own, say): rescue
        each job alone, and leave out from now on those it refuses alone, so that one row never
        stops the rescue of all others."""
        self._log.warning(
            "rescue refused by the database; rescuing jobs one by one", error=describe(refusal)
        )
        rescued: list[Row] = []
        for decision in decided:
            try:
                rescued += await self._q.jobs_rescue(self._pool, self._s.worker_id, [decision])
            except Exception as exc:
                if not refused(exc):
                    raise
                job_id = decision[0][0]
                self._refused.append(job_id)
                del self._refused[:-REFUSED_KEPT]
                self._log.error(
                    "job not rescued: the database refuses it; fix or delete the row",
                    job_id=job_id,
                    error=describe(exc),
                )
        return rescued

    async def resign(self) -> None:
        """Give the leadership up when the worker stops."""
        self._clear_gauges()
        await self.leadership.resign()
