"""Periodic slots: one worker of the fleet enqueues the due slots of the registry's schedules
(`Registry.periodic`), each exactly once.

The worker that does it holds a lease row of the `leader` table, as maintenance does, but named
after the schedule set (`periodic:` and a hash of it, see _schedule.set_name): the workers of one
deploy share it and elect one of them, and two fleets with other sets (two applications on one
database, two versions during a rolling deploy) each elect their own, so that each fleet's
schedules run whichever fleet holds the maintenance lease. Everything it writes is fenced by that
lease in the same statement.

Exactly once rests on the database, not on the election: a slot's job has the idempotency key
`periodic:{name}:{slot}`, unique in `jobs`, so two leaders during a handover (or two fleets that
define one name) insert it once. The `periodic` table keeps where each schedule stands (its next
slot), written in the statement that enqueues, so that a new leader goes on where the last one
stopped; slots missed while no leader ran are caught up by the schedule's `catch_up` policy.

The service sleeps until the next slot (bounded by the lease's renewal), not for a maintenance
tick: a one-second schedule is served each second, all its due slots in one statement."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio

from .._db.connection import SharedConnection, recover
from .._db.queries import queries
from .._logs import get_logger
from .._schedule import Schedule, key, set_name
from ..settings import Settings
from .leader import interval

WAKE_LATE = 0.002
"""Seconds slept past a slot, so that the clock read on waking is past it."""


def grace(lease: float) -> float:
    """How late a slot may be seen and still be on time (not missed): the longest a handover
    between two leaders takes, the lease running out and the next try of another worker."""
    return lease + interval(lease)


class Periodic:
    name = "periodic"

    def __init__(
        self,
        pool: Any,
        settings: Settings,
        schedules: Sequence[Schedule],
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self._pool = pool
        self._s = settings
        self._q = queries(settings.schema)
        self._schedules = {s.name: s for s in schedules}
        self.lease = set_name(schedules)
        self._stopping = stopping
        self._log = get_logger(worker_id=settings.worker_id)
        self.leading = False
        self._offset = timedelta(0)
        """The database's clock minus this host's, measured at each renewal."""
        self._renew_at = 0.0
        self._next: dict[str, datetime] = {}
        """Each schedule's first slot not yet dealt with, while this worker leads."""
        self.enqueued = 0

    def stopped(self) -> bool:
        return False

    def now(self) -> datetime:
        """The database's clock, as estimated at the last renewal."""
        return datetime.now(UTC) + self._offset

    async def reset(self, exc: Exception) -> None:
        if isinstance(self._pool, SharedConnection):
            await self._pool.drop()
        await recover(self._pool, exc)
        # The failure itself is logged (a lost database, once, by service.Contact); the next
        # step renews at once, and so learns whether the lease is still this worker's.
        self._lost("uncertain after a failure", quiet=True)
        self._renew_at = 0.0

    async def idle(self) -> None:
        await anyio.sleep(self.wait())

    def wait(self) -> float:
        """Seconds until the next due slot or the next renewal, whichever comes first."""
        renew = max(0.0, self._renew_at - anyio.current_time())
        if not self.leading or not self._next:
            return renew
        until = (min(self._next.values()) - self.now()).total_seconds() + WAKE_LATE
        return max(0.0, min(renew, until))

    async def step(self) -> None:
        if self._stopping():
            # A stopping worker (draining its jobs) leaves the schedules to the others at once,
            # and looks again only at the next renewal (never in a loop while it drains).
            self._renew_at = anyio.current_time() + interval(self._s.lease)
            await self.resign()
            return
        if anyio.current_time() >= self._renew_at:
            await self._renew()
        if self.leading:
            await self.enqueue_due()

    def _lost(self, why: str, *, quiet: bool = False) -> None:
        if self.leading:
            log = self._log.info if quiet else self._log.warning
            log(f"periodic: schedules' lease {why}", lease=self.lease)
        self.leading = False
        self._next.clear()

    async def _renew(self) -> None:
        """Take or renew the schedule set's lease, and read where each schedule stands (a new
        one starts from now): a leader of another set may have moved a shared name's row."""
        before = datetime.now(UTC)
        found = await self._q.periodic_lease(
            self._pool, self._s.worker_id, self._s.lease, self.lease
        )
        self._renew_at = anyio.current_time() + interval(self._s.lease)
        if found is None:
            self._lost("lost")
            return
        after = datetime.now(UTC)
        self._offset = found - (before + (after - before) / 2)
        now = self.now()
        rows = await self._q.periodic_sync(
            self._pool,
            self._s.worker_id,
            self.lease,
            [(s.name, s.task, s.definition, s.next_after(now)) for s in self._schedules.values()],
        )
        if not rows:
            self._lost("lost")
            return
        if not self.leading:
            self._log.info(
                "periodic: this worker enqueues the schedules",
                lease=self.lease,
                schedules=sorted(self._schedules),
            )
        self.leading = True
        for row in rows:
            schedule = self._schedules[row["name"]]
            stored: datetime = row["next_slot"]
            if row["schedule"] != schedule.definition:  # another fleet's, of the same name
                stored = schedule.next_after(now)
            mine = self._next.get(schedule.name)
            self._next[schedule.name] = stored if mine is None else max(mine, stored)

    async def enqueue_due(self) -> int:
        """Enqueue every due slot of every schedule in one statement; how many jobs it created."""
        now = self.now()
        jobs: list[tuple[str, str, str, int, str, datetime, str, int]] = []
        rows: list[tuple[str, str, str, datetime, datetime | None, str | None]] = []
        for s in self._schedules.values():
            start = self._next.get(s.name)
            if start is None or start > now:
                continue
            due = s.due(start, now, grace(self._s.lease))
            if due.capped:
                self._log.warning(
                    "periodic: more than 1,000 slots missed; only the most recent 1,000 are "
                    "enqueued (catch_up='all' is capped)",
                    schedule=s.name,
                    missed_since=start.isoformat(),
                    first_enqueued=due.slots[0].isoformat(),
                )
            if due.skipped:
                self._log.info(
                    "periodic: missed slots skipped by the schedule's catch_up policy",
                    schedule=s.name,
                    catch_up=s.catch_up,
                    skipped=due.skipped,
                    missed_since=start.isoformat(),
                )
            for slot in due.slots:
                jobs.append(
                    (
                        s.name,
                        s.task,
                        s.queue,
                        s.priority,
                        s.payload,
                        slot,
                        key(s.name, slot),
                        s.version,
                    )
                )
            last = due.slots[-1] if due.slots else None
            rows.append(
                (
                    s.name,
                    s.task,
                    s.definition,
                    s.next_after(now),
                    last,
                    None if last is None else key(s.name, last),
                )
            )
        if not rows:
            return 0
        leading, created = await self._q.periodic_enqueue(
            self._pool, self._s.worker_id, self.lease, jobs, rows
        )
        if not leading:
            self._lost("lost")
            return 0
        for name, _, _, following, _, _ in rows:
            self._next[name] = following
        self.enqueued += len(created)
        if created:
            self._log.debug("periodic: slots enqueued", keys=created)
        return len(created)

    async def resign(self) -> None:
        """Give the lease up when the worker stops, so that another worker takes over at once."""
        if self.leading:
            self.leading = False
            self._next.clear()
            await self._q.periodic_release(self._pool, self._s.worker_id, self.lease)
