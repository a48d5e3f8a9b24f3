"""Maintenance: what the elected worker does for the fleet, each duty a service of its own with
its own interval, run while this worker leads (see leader.py):

- `maintenance` (leader.Leader), every half lease, at most every 5 s: takes or renews the
  leadership; a stopping worker gives it up.
- `rescue`, as often: retries or fails the jobs whose lease expired.
- `retention`, every 5 min (every half lease while a backlog remains): deletes the finished jobs
  past their retention.
- `prune`, every 5 min: forgets workers long gone, rate windows, old events and rollup.
- `rollup`, every 30 s (every half lease while minutes wait): the console charts' minutes.
- `gauges` (with metrics on), every half lease, less often when their count is costly.
- `bulk`, every half lease (without a wait while one is left): runs the bulk actions whose runner
  died (its lease lapsed) or that no runner took (bulk.py).

Periodic schedules (periodic.py) have a lease of their own and are run by the Worker beside it.

Each service is run by the one supervised loop (_runtime/service.py), on the worker's shared
connection (or `pgworker serve`'s pool); `Worker.health()` reports them together as
`maintenance`. A worker that does not lead bids for the leadership every half lease; its duties
wait until it leads."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio

from .._runtime.leadership import Leadership
from .._runtime.service import Contact, Health, Joint, supervise
from ..registry import Registry
from ..settings import Settings
from .bulk import BulkActions
from .gauges import Gauges
from .leader import Duty, Leader, Led
from .prune import Prune
from .rescue import Rescue
from .retention import Retention, retention_ages
from .rollup import Rollup

if TYPE_CHECKING:
    from .._runtime.metrics import Metrics


class Maintenance:
    """The leader's services, made for one worker (or `pgworker serve`) on its connection
    `pool`: `run` runs them; `stopping` says the worker drains its jobs (it then gives the
    leadership up); `metrics`, when on, adds the queue gauges; `bulk=False` leaves the bulk
    actions to a runner of the caller's (`pgworker serve`'s)."""

    def __init__(
        self,
        pool: Any,
        settings: Settings,
        registry: Registry | None = None,
        stopping: Callable[[], bool] = lambda: False,
        metrics: Metrics | None = None,
        bulk: bool = True,
    ) -> None:
        self.leadership = Leadership(pool, settings)
        self.rescue = Rescue(pool, settings, registry, metrics)
        self.retention = Retention(pool, settings) if retention_ages(settings) else None
        self.prune = Prune(pool, settings)
        self.rollup = Rollup(pool, settings)
        self.bulk = BulkActions(pool, settings) if bulk else None
        self.gauges = (
            Gauges(pool, settings, metrics, self.leadership) if metrics is not None else None
        )
        duties: list[Duty | None] = [
            self.rescue,
            self.retention,
            self.prune,
            self.rollup,
            self.gauges,
            self.bulk,
        ]
        self.leader = Leader(self.leadership, pool, settings.lease, stopping, self._not_leading)
        self.services: list[Leader | Led] = [
            self.leader,
            *(Led(duty, self.leadership, pool) for duty in duties if duty is not None),
        ]
        self.healths = {service.name: Health() for service in self.services}
        renewal, *others = self.healths.values()
        self.health = Joint(renewal, others)
        """What `Worker.health()` reports as `maintenance`."""

    @property
    def leading(self) -> bool:
        return self.leadership.leading

    @property
    def rescued(self) -> int:
        return self.rescue.rescued

    async def run(self, log: Any, contact: Contact | None = None) -> None:
        """Run every service, each supervised, until cancelled; `contact` hears of a lost
        database (a Contact of its own when none is given: `pgworker serve`)."""
        own = Contact(log) if contact is None else None
        try:
            async with anyio.create_task_group() as tg:
                for service in self.services:
                    health = self.healths[service.name]
                    health.contact = contact or own
                    tg.start_soon(supervise, service, health, log)
        finally:
            if own is not None:
                own.close()

    async def tick(self) -> None:
        """One round of every service, the renewal first, without their waits (tests drive
        maintenance so)."""
        for service in self.services:
            await service.step()

    def _not_leading(self) -> None:
        if self.gauges is not None:
            self.gauges.clear()

    async def resign(self) -> None:
        """Give the leadership up when the worker stops."""
        await self.leader.resign()
