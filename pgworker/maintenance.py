"""Maintenance, run by one worker at a time: the holder of the leadership lease (a row of the
`leader` table, taken when free or expired, renewed at each tick). It rescues jobs whose lease
expired and forgets workers long gone.

A leader that freezes (SIGSTOP, a stalled VM) at any point of its cycle stops renewing: its lease
runs out and another worker leads. Every rescue is fenced by the lease, so a frozen leader that
resumes cannot act on an old belief that it still leads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from . import db
from .logs import get_logger
from .service import describe
from .settings import Settings

WORKERS_FORGOTTEN_AFTER = 24 * 3600.0
PRUNE_EVERY = 60
REFUSED_KEPT = 1000
"""How many jobs the database refused to rescue are remembered and left out."""


def interval(lease: float) -> float:
    """The leadership is renewed and expired leases looked for every half lease, at most every
    5 s."""
    return min(lease / 2, 5.0)


class Maintenance:
    name = "maintenance"

    def __init__(
        self, pool: Any, settings: Settings, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        self._pool = pool
        self._s = settings
        self._stopping = stopping
        self._log = get_logger(worker_id=settings.worker_id)
        self._ticks = 0
        self._refused: list[int] = []
        self.leading = False
        self.rescued = 0

    def done(self) -> bool:
        return False

    async def reset(self, exc: Exception) -> None:
        await db.recover(self._pool, exc)
        if self.leading:
            self._log.warning("maintenance: leadership uncertain after a failure")
        self.leading = False

    async def idle(self) -> None:
        await anyio.sleep(interval(self._s.lease))

    async def step(self) -> None:
        s = self._s
        if self._stopping():
            # A stopping worker (draining its jobs) leaves maintenance to the others at once.
            await self.resign()
            return
        leading = await db.lead(self._pool, s.schema, s.worker_id, s.lease)
        if leading != self.leading:
            self._log.info(
                "maintenance: this worker leads" if leading else "maintenance: leadership lost"
            )
        self.leading = leading
        if not leading:
            return
        try:
            rescued = await db.rescue(self._pool, s.schema, s.worker_id, skip=self._refused)
        except Exception as exc:
            if db.classify(exc) != "rejected":
                raise
            rescued = await self._rescue_one_by_one(exc)
        for row in rescued:
            self.rescued += 1
            self._log.warning(
                "job rescued: its worker stopped renewing the lease",
                job_id=row["id"],
                attempt=row["attempts"],
                correlation_id=row["correlation_id"],
                status=row["status"],
                lost_worker=row["worker_id"],
            )
        if self._ticks % PRUNE_EVERY == 0:
            await db.prune_workers(self._pool, s.schema, WORKERS_FORGOTTEN_AFTER)
        self._ticks += 1

    async def _rescue_one_by_one(self, refusal: Exception) -> list[Any]:
        """The database refused the rescue of a batch (a trigger of the user's own, say): rescue
        each job alone, and leave out from now on those it refuses alone, so that one row never
        stops the rescue of all others."""
        s = self._s
        self._log.warning(
            "rescue refused by the database; rescuing jobs one by one", error=describe(refusal)
        )
        rescued: list[Any] = []
        for job_id in await db.expired_jobs(self._pool, s.schema, self._refused):
            try:
                rescued += await db.rescue(self._pool, s.schema, s.worker_id, only=[job_id])
            except Exception as exc:
                if db.classify(exc) != "rejected":
                    raise
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
        if self.leading:
            await db.resign(self._pool, self._s.schema, self._s.worker_id)
            self.leading = False
