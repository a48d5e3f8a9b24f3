"""Retention (Settings.retain_completed, retain_failed): finished jobs past their age are
deleted with everything recorded about them, at most RETENTION_BATCH per statement and
RETENTION_BATCHES statements per round. A round every RETENTION_EVERY seconds; while a backlog
remains (the first run on an old database), one every half lease (at most every 5 s), each
short, never holding many locks.

Each statement runs on the connection the worker's outcome writes use (SharedConnection), which
it gives back between statements: a batch is small enough that an outcome write never waits
behind one for more than a few milliseconds, and a backlog is worked through in more
statements rather than larger ones."""

from __future__ import annotations

from typing import Any

import anyio

from .._db.queries import queries
from .._logs import get_logger
from .._redact import describe
from ..settings import Settings
from .leader import interval, refused

RETENTION_EVERY = 300.0
"""Seconds between two rounds when no backlog remains."""
RETENTION_BATCH = 250
"""The most jobs one statement deletes (with their records: 5 ms, against 16 ms and up to 55
for 1,000 at once)."""
RETENTION_BATCHES = 40
"""The most statements per round; fewer once half its interval is spent."""


def retention_ages(settings: Settings) -> dict[str, float]:
    """The age past which each finished status is deleted; a status kept forever is absent."""
    ages: dict[str, float] = {}
    if settings.retain_completed is not None:
        ages["completed"] = settings.retain_completed
    if settings.retain_failed is not None:
        ages["failed"] = ages["cancelled"] = settings.retain_failed
    return ages


class Retention:
    name = "retention"
    every = RETENTION_EVERY

    def __init__(self, pool: Any, settings: Settings) -> None:
        self._pool = pool
        self._s = settings
        self._q = queries(settings.schema)
        self._log = get_logger(worker_id=settings.worker_id)
        self._ages = retention_ages(settings)
        self._soon = interval(settings.lease)

    async def step(self) -> float:
        """Delete a few batches, fenced by the leadership. Until a batch comes back short, a
        backlog is left for the next round, soon (a lost connection included)."""
        pruned: dict[str, int] = {}
        budget = anyio.current_time() + self._soon / 2
        backlog = True
        for _ in range(RETENTION_BATCHES):
            try:
                batch = await self._q.jobs_prune(
                    self._pool, self._ages, RETENTION_BATCH, self._s.worker_id
                )
            except Exception as exc:
                if not refused(exc):
                    raise
                # A trigger of the user's own refusing the delete: said once per round; the
                # other duties go on meanwhile.
                self._log.error("retention refused by the database", error=describe(exc))
                backlog = False
                break
            for status, n in batch.items():
                pruned[status] = pruned.get(status, 0) + n
            if sum(batch.values()) < RETENTION_BATCH:
                backlog = False
                break
            if anyio.current_time() > budget:
                break
        if pruned:
            self._log.info("pruned finished jobs past their retention", **pruned, backlog=backlog)
        return self._soon if backlog else RETENTION_EVERY
