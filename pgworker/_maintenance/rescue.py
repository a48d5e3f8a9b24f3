"""The rescue: the jobs whose lease expired (their worker died, froze or was cut off) are
retried under the same rule as a failed attempt (`retry.next_retry`, with their task's policy),
so that each waits for its backoff; out of retries, it fails. Its open attempt is closed as
`lost`. Every half lease (at most every 5 s), a page of PAGE jobs per statement, at most
RESCUE_PAGES pages per round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from .._db.queries import AttemptKey, Row, queries
from .._logs import get_logger
from .._redact import describe
from ..registry import Registry
from ..retry import RetryPolicy, next_retry
from ..settings import Settings
from .leader import interval, refused

if TYPE_CHECKING:
    from .._runtime.metrics import Metrics

PAGE = 250
"""The most jobs jobs_expired.sql returns at once, and one rescue statement writes."""
RESCUE_PAGES = 4
"""The most pages of expired jobs rescued per round; fewer once half its interval is spent."""
REFUSED_KEPT = 1000
"""How many jobs the database refused to rescue are remembered and left out."""
REFUSED_RETRY = 300.0
"""Seconds after which the jobs the database refused to rescue are tried again: what refused
them may have been fixed."""

Decision = tuple[AttemptKey, str, float, int]
"""(attempt, next status, seconds until it runs again, 1 when counted as a retry)."""


class Rescue:
    name = "rescue"

    def __init__(
        self,
        pool: Any,
        settings: Settings,
        registry: Registry | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._s = settings
        self._q = queries(settings.schema)
        self._registry = registry
        self._metrics = metrics
        self._log = get_logger(worker_id=settings.worker_id)
        self.every = interval(settings.lease)
        self._refused: list[int] = []
        self._refused_since: float | None = None
        self._after: tuple[Any, int] | None = None
        self.rescued = 0

    async def step(self) -> float:
        now = anyio.current_time()
        if self._refused_since is None or now - self._refused_since >= REFUSED_RETRY:
            self._refused.clear()
            self._refused_since = now
        budget = now + self.every / 2
        for _ in range(RESCUE_PAGES):
            if not await self._page() or anyio.current_time() > budget:
                break
        return self.every

    async def _page(self) -> bool:
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
        each job alone, and leave out for REFUSED_RETRY seconds those it refuses alone, so that
        one row never stops the rescue of all others."""
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
