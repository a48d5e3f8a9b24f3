"""The heartbeat: a worker says it is alive (its row in `workers`, which `pgworker status`
reads) and keeps the leases of its running attempts, which is how it learns of cancel requests
the notifications missed and of leases it lost; and the guard that stops those attempts when the
heartbeat has not been answered for too long (the worker fences itself)."""

from __future__ import annotations

import os
import socket
import time
from datetime import UTC, datetime

import anyio
import anyio.abc

from .._db.connection import Executor, classify, recover
from .._db.queries import AttemptKey, Beat, queries
from .._logs import get_logger
from .._redact import describe
from ..models import Outcome
from ..settings import Settings
from .producer import Producer

BEAT_TIMEOUT_CAP = 10.0
"""The longest a heartbeat waits for the database, whatever the lease."""


def beat_timeout(lease: float) -> float:
    """How long one heartbeat (its statements, and taking a connection for them) may take: its
    period, at most BEAT_TIMEOUT_CAP. A statement on a network that drops packets silently never
    answers; past this the heartbeat closes its connection and tries again on a new one."""
    return min(lease / 3, BEAT_TIMEOUT_CAP)


def fence_margin(lease: float) -> float:
    """How long before its leases can expire a worker that cannot renew them stops its attempts
    (Settings: the self-fence)."""
    return lease / 6


class Heartbeat:
    """The heartbeat service: every third of the lease, extend the leases of all running attempts
    in one statement, say the worker is alive, act on cancel requests the notifications missed,
    and stop the attempts whose lease was lost (their job was rescued and may already run
    elsewhere). Each heartbeat is bounded (beat_timeout). Its `guard` stops every attempt, and
    the claims, when no heartbeat has been answered for the lease less fence_margin, and lets the
    worker serve again once one is."""

    name = "heartbeat"

    def __init__(self, producer: Producer, settings: Settings) -> None:
        self._producer = producer
        self._settings = settings
        self._q = queries(settings.schema)
        self._log = get_logger(worker_id=settings.worker_id)
        self._timeout = beat_timeout(settings.lease)
        self._renewed = anyio.current_time()
        """When the last heartbeat that the database answered was sent (the event loop's clock):
        the leases it extended run out no sooner than this plus the lease, since the server set
        them from its own now(), later than the sending."""
        self._answered: anyio.Event | None = None
        """Set when a heartbeat is answered while the worker is fenced; None while not fenced."""

    async def register(self, conn: Executor | None = None) -> None:
        """Record (or refresh) this worker in the `workers` table that `pgworker status` reads;
        its `types` are the (type, payload version) pairs it serves, version 1 as the bare type
        name and the others as `type@version` (registry.served_key): no schema change, and the
        rows of workers serving version 1 only read as before."""
        s = self._settings
        await self._q.worker_register(
            conn or self._producer.shared,
            s.worker_id,
            socket.gethostname(),
            os.getpid(),
            s.served_queues,
            self._producer.served,
            s.concurrency,
            s.lease,
        )

    async def unregister(self) -> None:
        await self._q.worker_unregister(self._producer.shared, self._settings.worker_id)

    def stopped(self) -> bool:
        return False

    async def reset(self, exc: Exception) -> None:
        await self._producer.shared.drop()
        await recover(self._producer.pool, exc)

    async def idle(self) -> None:
        await anyio.sleep(self._settings.lease / 3)

    async def step(self) -> None:
        """One heartbeat, within beat_timeout, on the worker's shared connection: past it,
        TimeoutError, and that connection is closed rather than given back (its statement, ours
        or the one we waited behind, may never be answered)."""
        shared = self._producer.shared
        with anyio.move_on_after(self._timeout) as bound:
            async with shared.acquire() as conn:
                await self._beat(conn)
        if bound.cancelled_caught:
            shared.abandon()
            raise TimeoutError(f"the database did not answer within {self._timeout:g}s")

    async def _beat(self, conn: Executor) -> None:
        s = self._settings
        producer = self._producer
        # Attempts stopped by the guard are not renewed: their jobs are left to the rescue.
        fenced = producer.fenced
        attempts = [a for a in producer.running if a not in fenced]
        # Attempts whose outcome waits to be written keep their lease too: a job done here is not
        # rescued because its outcome write is slow or blocked.
        sent = [(a.id, a.number, a.claimed_at) for a in attempts] + producer.unwritten()
        sent_at = anyio.current_time()
        try:
            held = await self._q.worker_heartbeat(conn, sent, s.lease)
        except Exception as exc:
            if classify(exc) != "rejected":
                raise
            held = await self._one_by_one(conn, sent, exc)
        self._renewed = sent_at
        if self._answered is not None:
            self._answered.set()
        await self.register(conn)
        for attempt in attempts:
            if attempt not in producer.running or attempt.stopped_as is not None:
                continue
            beat = held.get((attempt.id, attempt.number))
            if beat is None:
                attempt.log.warning("lease lost: stopping the attempt")
                attempt.stop(Outcome.LOST)
            elif beat.cancel_requested:
                producer.cancel(attempt.id)

    async def guard(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Fence the worker when no heartbeat has been answered since lease - fence_margin
        seconds: stop its attempts as `lost` (their outcomes not written) and its claims, before
        their leases can expire and their jobs run elsewhere; serve again once a heartbeat is
        answered. Started before the first claim: every lease taken after it outlives the
        first deadline."""
        s = self._settings
        self._renewed = anyio.current_time()
        task_status.started()
        while True:
            wait = self._renewed + s.lease - fence_margin(s.lease) - anyio.current_time()
            if wait > 0:
                await anyio.sleep(wait)
                continue
            answered = self._answered = anyio.Event()
            fenced_at = anyio.current_time()
            expire_at = time.time() + (self._renewed + s.lease - fenced_at)
            self._log.warning(
                "lost contact with the database: stopping the attempts before their leases expire",
                attempts=self._producer.fence(),
                leases_expire_at=datetime.fromtimestamp(expire_at, UTC).isoformat(
                    timespec="milliseconds"
                ),
                last_answered_s_ago=round(fenced_at - self._renewed, 1),
            )
            await answered.wait()
            self._answered = None
            self._producer.unfence()
            self._log.info(
                "the database answers again: claiming again",
                fenced_s=round(anyio.current_time() - fenced_at, 1),
            )

    async def _one_by_one(
        self, conn: Executor, sent: list[AttemptKey], refusal: Exception
    ) -> dict[tuple[int, int], Beat]:
        """The database refused the batch (a trigger of the user's own, say): extend each lease
        alone, so that one refused row does not cost every other job its lease. A row refused
        alone is reported held: its lease runs out, the job is rescued, and the next heartbeat
        stops the attempt."""
        s = self._settings
        held: dict[tuple[int, int], Beat] = {}
        for attempt in sent:
            try:
                held |= await self._q.worker_heartbeat(conn, [attempt], s.lease)
            except Exception as exc:
                if classify(exc) != "rejected":
                    raise
                held[attempt[:2]] = Beat(cancel_requested=False, extended=False)
                self._log.error(
                    "lease not extended: the database refuses it",
                    job_id=attempt[0],
                    attempt=attempt[1],
                    error=describe(exc),
                    batch_error=describe(refusal),
                )
        return held
