"""Leadership: one worker at a time does what must not be done by all (rescue lost jobs, forget
workers long gone). The leader holds a lease row of the `leader` table, taken when free or
expired and renewed by the maintenance's renewal service (_maintenance/leader.py).

A leader that freezes (SIGSTOP, a stalled VM) at any point stops renewing: its lease runs out and
another worker leads. Everything a leader writes is fenced by the lease in the same statement, so
a frozen leader that resumes cannot act on an old belief that it still leads.
"""

from __future__ import annotations

from typing import Any

import anyio

from .._db.queries import queries
from .._logs import get_logger
from ..settings import Settings


class Leadership:
    def __init__(self, pool: Any, settings: Settings) -> None:
        self._pool = pool
        self._s = settings
        self._q = queries(settings.schema)
        self._log = get_logger(worker_id=settings.worker_id)
        self.leading = False
        self._led: anyio.Event | None = None
        """Set once this worker leads (made when first awaited: it needs the event loop)."""

    async def renew(self) -> bool:
        """Take the leadership, or renew it, for a lease; returns whether this worker leads."""
        leading = await self._q.leader_take(self._pool, self._s.worker_id, self._s.lease)
        if leading != self.leading:
            self._log.info(
                "maintenance: this worker leads" if leading else "maintenance: leadership lost"
            )
        self._set(leading)
        return leading

    def uncertain(self) -> None:
        """A renewal failed: whether the lease is still ours is unknown until the next one. Said
        at INFO: the failure itself is logged (a lost database, once, by service.Contact)."""
        if self.leading:
            self._log.info("maintenance: leadership uncertain after a failure")
        self._set(False)

    async def resign(self) -> None:
        """Give the leadership up (a stopping worker), so that another worker takes it at once."""
        if self.leading:
            await self._q.leader_release(self._pool, self._s.worker_id)
            self._set(False)

    async def gained(self) -> None:
        """Return once this worker leads (at once if it does)."""
        while not self.leading:
            if self._led is None or self._led.is_set():
                self._led = anyio.Event()
            await self._led.wait()

    def _set(self, leading: bool) -> None:
        self.leading = leading
        if leading and self._led is not None:
            self._led.set()
