"""Outcomes → guarded writes, in batches, on a connection of the completer's own: LINGER seconds
after the first outcome of a batch arrives, one statement writes all that arrived meanwhile. The
write runs while the producer's next claim does (two backends, commits that share a WAL flush),
which measured faster than carrying the outcomes in the claim: that made each cycle wait for both.
A write that fails on a lost connection is retried until the database is back. Outcomes whose
attempt no longer holds the job are dropped, and logged."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import anyio
import asyncpg

from . import db
from .logs import get_logger
from .models import AttemptResult, JobStatus

LINGER = 0.003


class Completer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        worker_id: str,
        on_requeued: Callable[[float], None] = lambda delay: None,
        max_batch: int = 500,
        give_up_after: float = 30.0,
    ) -> None:
        self.give_up_after = give_up_after
        self._pool = pool
        self._conn = db.HeldConnection(pool)
        self._on_requeued = on_requeued
        self._schema = schema
        self._max_batch = max_batch
        self._buffer: list[AttemptResult] = []
        self._ready = anyio.Event()
        self._closing = False
        self.finished = anyio.Event()
        self._log = get_logger(worker_id=worker_id)
        self.written = 0
        self.dropped = 0

    def submit(self, result: AttemptResult) -> None:
        self._buffer.append(result)
        self._ready.set()

    def _take(self) -> list[AttemptResult]:
        batch = self._buffer[: self._max_batch]
        del self._buffer[: self._max_batch]
        return batch

    def close(self) -> None:
        """Finish once everything submitted so far is written."""
        self._closing = True
        self._ready.set()

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            if not self._closing:
                await anyio.sleep(LINGER)  # let the batch fill
            while self._buffer:
                await self._write(self._take())
            if self._closing:
                await self._conn.drop()
                self.finished.set()
                return

    async def _write(self, batch: list[AttemptResult]) -> None:
        failures = 0
        give_up_at = float("inf")
        while True:
            try:
                written = await db.finish_many(await self._conn.get(), self._schema, batch)
                break
            except (*db.CONNECTION_ERRORS, asyncpg.exceptions.TransactionRollbackError) as exc:
                await self._conn.drop()
                if self._closing:
                    give_up_at = min(give_up_at, anyio.current_time() + self.give_up_after)
                if anyio.current_time() > give_up_at:
                    self._log.error(
                        "database unreachable at shutdown: outcomes not written; their jobs "
                        "will be rescued when their lease expires",
                        jobs=len(batch),
                    )
                    return
                failures += 1
                delay = min(0.05 * 2**failures, 5.0) * random.uniform(0.5, 1.5)
                self._log.warning(
                    "outcome write failed; retrying",
                    error=str(exc),
                    jobs=len(batch),
                    retry_in_s=round(delay, 2),
                )
                await anyio.sleep(delay)
        await self._settle(batch, written, uncertain=bool(failures))

    async def _settle(
        self, batch: list[AttemptResult], written: set[int], *, uncertain: bool = False
    ) -> None:
        """Account for a written batch: requeued jobs wake the producer at their time; outcomes
        not written were fenced, unless a try lost with its connection (`uncertain`) had
        committed them."""
        missing = [r for r in batch if r.job_id not in written]
        if missing and uncertain:
            with contextlib.suppress(*db.CONNECTION_ERRORS):
                recorded = await db.attempt_outcomes(
                    self._pool, self._schema, [(r.job_id, r.attempt, r.claimed_at) for r in missing]
                )
                written |= {r.job_id for r in missing if recorded.get(r.job_id) == r.outcome}
        self.written += len(written)
        for r in batch:
            if r.job_id in written:
                if r.status is JobStatus.PENDING:
                    self._on_requeued(r.delay)
            else:
                self.dropped += 1
                self._log.warning(
                    "outcome dropped: this attempt no longer holds the job",
                    job_id=r.job_id,
                    attempt=r.attempt,
                    outcome=r.outcome.value,
                )
