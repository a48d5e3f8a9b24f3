"""The queue gauges of the metrics (pgworker_queue_jobs and the like), which only the leader
shows: refreshed every half lease (at most every 5 s), unless their query took more than
1/GAUGES_SHARE of that: then less often, so that on a huge table their count never costs the
database more than that share."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .._db.queries import queries
from .._runtime.leadership import Leadership
from ..settings import Settings
from .leader import interval

if TYPE_CHECKING:
    from .._runtime.metrics import Metrics

GAUGES_SHARE = 20


class Gauges:
    name = "gauges"

    def __init__(
        self, pool: Any, settings: Settings, metrics: Metrics, leadership: Leadership
    ) -> None:
        self._pool = pool
        self._q = queries(settings.schema)
        self._metrics = metrics
        self._leadership = leadership
        self.every = interval(settings.lease)

    async def step(self) -> float:
        from .._runtime.metrics import MAX_QUEUES

        started = anyio.current_time()
        rows = await self._q.metrics_queues(self._pool, MAX_QUEUES)
        if self._leadership.leading:
            self._metrics.queues(rows)
        return max(self.every, (anyio.current_time() - started) * GAUGES_SHARE)

    def clear(self) -> None:
        """Only the elected worker shows the queue gauges."""
        self._metrics.queues(None)
