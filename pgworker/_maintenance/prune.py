"""Pruning: every PRUNE_EVERY seconds, what no one reads any more is forgotten: workers gone
for a day, rate windows, events and the charts' rollup older than the longest retention of
finished jobs."""

from __future__ import annotations

from typing import Any

from .._db.queries import queries
from ..settings import Settings
from .retention import retention_ages
from .rollup import ROLLUP_REACH

PRUNE_EVERY = 300.0
"""Seconds between two rounds."""
WORKERS_FORGOTTEN_AFTER = 24 * 3600.0
LIMITS_PRUNE_BATCH = 10_000
"""The most rate windows forgotten per round (limits_prune.sql)."""
EVENTS_PRUNE_BATCH = 10_000
"""The most events (pgworker.emit) forgotten per round (events_prune.sql): those older than the
longest retention of finished jobs."""
STATS_PRUNE_BATCH = 1440
"""The most minutes of rollup forgotten per round, those older than the longest retention of
finished jobs (and a day at least)."""


class Prune:
    name = "prune"
    every = PRUNE_EVERY

    def __init__(self, pool: Any, settings: Settings) -> None:
        self._pool = pool
        self._q = queries(settings.schema)
        ages = retention_ages(settings)
        self._kept = max(ages.values()) if ages else None
        """Events and rollup live as long as the finished jobs kept the longest (forever: None)."""

    async def step(self) -> float:
        await self._q.workers_prune(self._pool, WORKERS_FORGOTTEN_AFTER)
        await self._q.limits_prune(self._pool, LIMITS_PRUNE_BATCH)
        if self._kept is not None:
            await self._q.events_prune(self._pool, self._kept, EVENTS_PRUNE_BATCH)
            kept = max(self._kept, ROLLUP_REACH)
            await self._q.stats_prune(self._pool, kept, STATS_PRUNE_BATCH)
        return PRUNE_EVERY
