"""The leader and the duties it runs. One service renews the leadership (Leadership, the lease
row of the `leader` table) every half lease, at most every 5 s; each duty (rescue, retention,
pruning, rollup, gauges) is a service of its own, run by `Led` while this worker leads, at its
own interval. A duty's writes are fenced by the lease in their own statements: a duty that acts
on an old belief that this worker leads changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import anyio
import asyncpg

from .._db.connection import SharedConnection, classify, recover
from .._runtime.leadership import Leadership


def interval(lease: float) -> float:
    """The leadership is renewed, and expired leases looked for, every half lease, at most every
    5 s; a duty behind on its work (a backlog) comes back after as long."""
    return min(lease / 2, 5.0)


def refused(exc: BaseException) -> bool:
    """Whether the database refused a duty's statement for what the rows are or set off: the
    values, or a trigger of the user's (whatever it raises: a refusal, a privilege it lacks, a
    table it needs that is gone). A lost connection or a statement to retry is no refusal."""
    kind = classify(exc)
    return kind == "rejected" or (kind == "unexpected" and isinstance(exc, asyncpg.PostgresError))


class Duty(Protocol):
    """One duty of the leader's: `every` is its interval in seconds; `step` does a round (fenced
    by the leadership) and returns the seconds until the next: `every`, or less while behind."""

    name: str
    every: float

    async def step(self) -> float: ...


async def _drop(pool: Any, exc: Exception) -> None:
    """After a failed statement: the shared connection is given back (the next borrower takes
    another), read-only sessions replaced."""
    if isinstance(pool, SharedConnection):
        await pool.drop()
    await recover(pool, exc)


class Leader:
    """The renewal service (`maintenance` in `Worker.health()` and the logs): takes or renews the
    leadership every `interval(lease)`. A stopping worker (draining its jobs) gives it up at
    once, leaving maintenance to the others. `on_lost` is called whenever this worker does not
    lead after a renewal or a failure (the queue gauges are only the leader's)."""

    name = "maintenance"

    def __init__(
        self,
        leadership: Leadership,
        pool: Any,
        lease: float,
        stopping: Callable[[], bool],
        on_lost: Callable[[], None],
    ) -> None:
        self._leadership = leadership
        self._pool = pool
        self.every = interval(lease)
        self._stopping = stopping
        self._on_lost = on_lost

    def stopped(self) -> bool:
        return False

    async def step(self) -> None:
        if self._stopping():
            await self.resign()
        elif not await self._leadership.renew():
            self._on_lost()

    async def idle(self) -> None:
        await anyio.sleep(self.every)

    async def reset(self, exc: Exception) -> None:
        await _drop(self._pool, exc)
        self._leadership.uncertain()
        self._on_lost()

    async def resign(self) -> None:
        self._on_lost()
        await self._leadership.resign()


class Led:
    """A duty as a service (service.py's `supervise` runs it): a round while this worker leads,
    then the wait the duty asks for; while another worker leads, a wait for the leadership. A
    failed round leaves the leadership as it is: the renewal alone finds whether it is still
    this worker's."""

    def __init__(self, duty: Duty, leadership: Leadership, pool: Any) -> None:
        self.duty = duty
        self.name = duty.name
        self._leadership = leadership
        self._pool = pool
        self.wait: float | None = None
        """Seconds until the next round, as the last one said; None: until this worker leads."""

    def stopped(self) -> bool:
        return False

    async def step(self) -> None:
        if not self._leadership.leading:
            self.wait = None
            return
        self.wait = await self.duty.step()

    async def idle(self) -> None:
        if self.wait is None:
            await self._leadership.gained()
        else:
            await anyio.sleep(self.wait)

    async def reset(self, exc: Exception) -> None:
        await _drop(self._pool, exc)
