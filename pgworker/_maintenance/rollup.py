"""The console charts' per-minute rollup (sql/queries/stats_rollup.sql): every ROLLUP_EVERY
seconds (every half lease, at most every 5 s, while minutes wait), one statement per minute, at
most ROLLUP_MINUTES minutes per round: the minutes closed since the last rolled up, newest
first, then those to roll up again. Nothing is added to the claim or the outcome writes."""

from __future__ import annotations

from typing import Any

import anyio

from .._db.queries import queries
from .._logs import get_logger
from .._redact import describe
from ..settings import Settings
from .leader import interval, refused

ROLLUP_EVERY = 30.0
"""Seconds between two rounds when no minute waits."""
ROLLUP_MINUTES = 60
"""The most minutes rolled up per round; fewer once half its interval is spent."""
ROLLUP_SETTLE = 60.0
"""Seconds after its end before a minute is rolled up: its attempts and jobs carry their
transaction's start time, and commit a little later."""
ROLLUP_RECHECK = 600.0
"""A minute is rolled up again once, this many seconds after its end, for jobs enqueued by a
transaction that began in it and committed after its first rollup."""
ROLLUP_REACH = 86400.0
"""How far back minutes are rolled up: the longest chart (a day)."""


class Rollup:
    name = "rollup"
    every = ROLLUP_EVERY

    def __init__(self, pool: Any, settings: Settings) -> None:
        self._pool = pool
        self._s = settings
        self._q = queries(settings.schema)
        self._log = get_logger(worker_id=settings.worker_id)
        self._soon = interval(settings.lease)
        self.behind = True
        """Minutes wait (at start: the empty ones of a new install are marked first)."""

    async def step(self) -> float:
        await self.roll_up()
        return self._soon if self.behind else ROLLUP_EVERY

    async def roll_up(self) -> int:
        """Roll up (again) the minutes due, a statement each, fenced by the leadership; how many.
        Minutes left for lack of time are rolled up at the next round."""
        budget = anyio.current_time() + self._soon / 2
        if self.behind:
            await self._q.stats_rollup_empty(
                self._pool, self._s.worker_id, ROLLUP_REACH, ROLLUP_RECHECK
            )
        due = await self._q.stats_rollup_due(
            self._pool, ROLLUP_SETTLE, ROLLUP_RECHECK, ROLLUP_REACH, ROLLUP_MINUTES
        )
        self.behind = len(due) >= ROLLUP_MINUTES
        done = 0
        for minute in due:
            if anyio.current_time() > budget:
                self.behind = True
                break
            try:
                await self._q.stats_rollup(self._pool, minute, self._s.worker_id)
            except Exception as exc:
                if not refused(exc):
                    raise
                # A privilege the worker lacks on the rollup's tables: said at each round; the
                # other duties go on, the charts read job_attempts.
                self._log.error("charts rollup refused by the database", error=describe(exc))
                self.behind = False
                break
            done += 1
        return done
