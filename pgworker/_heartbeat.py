"""The heartbeat: a worker says it is alive (its row in `workers`, which `pgworker status`
reads) and keeps the leases of its running attempts, which is how it learns of cancel requests
the notifications missed and of leases it lost."""

from __future__ import annotations

import os
import socket

import anyio

from ._db.connection import classify, recover
from ._db.queries import AttemptKey, Beat, queries
from ._logs import get_logger
from ._producer import Producer
from ._redact import describe
from .models import Outcome
from .settings import Settings


class Heartbeat:
    """The heartbeat service: every third of the lease, extend the leases of all running attempts
    in one statement, say the worker is alive, act on cancel requests the notifications missed,
    and stop the attempts whose lease was lost (their job was rescued and may already run
    elsewhere)."""

    name = "heartbeat"

    def __init__(self, producer: Producer, settings: Settings) -> None:
        self._producer = producer
        self._settings = settings
        self._q = queries(settings.schema)
        self._log = get_logger(worker_id=settings.worker_id)

    async def register(self) -> None:
        """Record (or refresh) this worker in the `workers` table that `pgworker status` reads;
        its `types` are the (type, payload version) pairs it serves, version 1 as the bare type
        name and the others as `type@version` (registry.served_key): no schema change, and the
        rows of workers serving version 1 only read as before."""
        s = self._settings
        await self._q.worker_register(
            self._producer.pool,
            s.worker_id,
            socket.gethostname(),
            os.getpid(),
            s.served_queues,
            self._producer.served,
            s.concurrency,
        )

    async def unregister(self) -> None:
        await self._q.worker_unregister(self._producer.pool, self._settings.worker_id)

    def done(self) -> bool:
        return False

    async def reset(self, exc: Exception) -> None:
        await recover(self._producer.pool, exc)

    async def idle(self) -> None:
        await anyio.sleep(self._settings.lease / 3)

    async def step(self) -> None:
        s = self._settings
        producer = self._producer
        attempts = list(producer.running)
        # Attempts whose outcome waits to be written keep their lease too: a job done here is not
        # rescued because its outcome write is slow or blocked.
        sent = [(a.id, a.number, a.claimed_at) for a in attempts] + producer.unwritten()
        try:
            held = await self._q.worker_heartbeat(producer.pool, sent, s.lease)
        except Exception as exc:
            if classify(exc) != "rejected":
                raise
            held = await self._one_by_one(sent, exc)
        await self.register()
        for attempt in attempts:
            if attempt not in producer.running or attempt.stopped_as is not None:
                continue
            beat = held.get((attempt.id, attempt.number))
            if beat is None:
                attempt.log.warning("lease lost: stopping the attempt")
                attempt.stop(Outcome.LOST)
            elif beat.cancel_requested:
                producer.cancel(attempt.id)

    async def _one_by_one(
        self, sent: list[AttemptKey], refusal: Exception
    ) -> dict[tuple[int, int], Beat]:
        """The database refused the batch (a trigger of the user's own, say): extend each lease
        alone, so that one refused row does not cost every other job its lease. A row refused
        alone is reported held: its lease runs out, the job is rescued, and the next heartbeat
        stops the attempt."""
        s = self._settings
        held: dict[tuple[int, int], Beat] = {}
        for attempt in sent:
            try:
                held |= await self._q.worker_heartbeat(self._producer.pool, [attempt], s.lease)
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
