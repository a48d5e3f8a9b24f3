"""Outcomes → guarded writes, in batches, on the worker's shared connection (the heartbeat, the
maintenance and the steps' records take turns on it between writes): LINGER seconds
after the first outcome of a batch arrives, one statement writes all that arrived meanwhile. The
write runs while the producer's next claim does (two backends, commits that share a WAL flush),
which measured faster than carrying the outcomes in the claim: that made each cycle wait for both.

A batch whose write fails stays in flight: the supervisor (service.py) backs off and the next step
writes it again, re-checking after a lost connection which outcomes had committed. A batch the
server refuses (a value it cannot store) is written row by row, so that one bad row never blocks
or loses the others; a row refused on its own is recorded as a failed attempt saying why.
Outcomes whose attempt no longer holds the job are dropped, and logged."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import anyio
import asyncpg

from .._db.connection import SharedConnection, classify, recover
from .._db.queries import queries
from .._logs import get_logger
from .._redact import describe
from ..models import AttemptResult, JobStatus, Outcome

LINGER = 0.003


class Completer:
    name = "completer"

    def __init__(
        self,
        pool: asyncpg.Pool,
        schema: str,
        worker_id: str,
        on_requeued: Callable[[float], None] = lambda delay: None,
        on_settled: Callable[[AttemptResult, str | None], None] = lambda result, outcome: None,
        freed: Callable[[list[AttemptResult]], Sequence[tuple[int, str, str]]] = lambda batch: [],
        max_batch: int = 500,
        give_up_after: float = 30.0,
        pooler: bool = False,
    ) -> None:
        self.give_up_after = give_up_after
        self._pool = pool
        self.shared = SharedConnection(pool, pooler=pooler)
        """Where the outcomes are written, lent between writes (see SharedConnection)."""
        self._q = queries(schema)
        self._on_requeued = on_requeued
        self._on_settled = on_settled
        self._freed = freed
        self._schema = schema
        self._max_batch = max_batch
        self._buffer: list[AttemptResult] = []
        self._batch: list[AttemptResult] = []
        self._uncertain = False
        self._ready = anyio.Event()
        self._closing = False
        self._give_up_at = float("inf")
        self.finished = anyio.Event()
        self._log = get_logger(worker_id=worker_id)
        self.written = 0
        self.dropped = 0

    def unwritten(self) -> list[tuple[int, int, datetime]]:
        """The attempts whose outcome is submitted and not yet written."""
        return [(r.job_id, r.attempt, r.claimed_at) for r in (*self._batch, *self._buffer)]

    def submit(self, result: AttemptResult) -> None:
        self._buffer.append(result)
        self._ready.set()

    def abandon_connection(self) -> None:
        """The database stopped answering: close the connection now (a write waiting on it
        fails as on a lost connection, and is written again on a new one)."""
        self.shared.abandon()

    def close(self) -> None:
        """Finish once everything submitted so far is written (or given up on, when the
        database stays unreachable for `give_up_after` seconds)."""
        self._closing = True
        self._give_up_at = anyio.current_time() + self.give_up_after
        self._ready.set()

    def stopped(self) -> bool:
        return self.finished.is_set()

    async def flush(self) -> None:
        """Write what is buffered from the calling task, as the completer's own task would have
        (its task was cancelled with the worker). Its held connection may have been cancelled in
        the middle of a statement: a fresh one is taken."""
        self.close()
        await self.shared.discard()
        while not self.stopped():
            try:
                await self.step()
            except Exception as exc:
                self._log.warning("outcome write failed; retrying", error=describe(exc))
                await self.reset(exc)
                await anyio.sleep(0.2)

    async def idle(self) -> None:
        await self._ready.wait()
        self._ready = anyio.Event()
        if not self._closing:
            await anyio.sleep(LINGER)  # let the batch fill

    async def reset(self, exc: Exception) -> None:
        await self.shared.drop()
        await recover(self._pool, exc)

    async def step(self) -> None:
        """Write everything buffered, batch by batch; when closing and all is written, finish."""
        while self._batch or self._buffer:
            if not self._batch:
                self._uncertain = False
            # Outcomes that arrived join a batch retried after a failure: a row held locked
            # elsewhere must not keep the others waiting.
            room = self._max_batch - len(self._batch)
            if room > 0 and self._buffer:
                self._batch += self._buffer[:room]
                del self._buffer[:room]
            if self._closing and anyio.current_time() > self._give_up_at:
                self._give_up()
                break
            await self._write()
        if self._closing:
            await self.shared.drop()
            self.finished.set()

    def _give_up(self) -> None:
        jobs = len(self._batch) + len(self._buffer)
        self._log.error(
            "database unreachable at shutdown: outcomes not written; their jobs will be rescued "
            "when their lease expires",
            jobs=jobs,
        )
        self.dropped += jobs
        for r in (*self._batch, *self._buffer):
            self._on_settled(r, None)
        self._batch, self._buffer = [], []

    async def _write(self) -> None:
        batch = self._batch
        try:
            written = await self._q.job_finish_many(self.shared, batch)
        except Exception as exc:
            kind = classify(exc)
            if kind == "rejected" or isinstance(exc, asyncpg.exceptions.LockNotAvailableError):
                self._log.warning(
                    "outcome batch not written; writing its rows one by one",
                    error=describe(exc),
                    jobs=len(batch),
                )
                await self._write_one_by_one()
                return
            if kind == "connection":
                self._uncertain = True
            raise
        await self._settle(batch, written, uncertain=self._uncertain)
        self._batch = []

    async def _write_one_by_one(self) -> None:
        """Write each row of the batch alone. A row another session holds locked waits for the
        next step, while the others are written. Rows leave the batch as they go, so that a lost
        connection midway resumes with the rest."""
        deferred: list[AttemptResult] = []
        locked: Exception | None = None
        try:
            while self._batch:
                try:
                    await self._write_row(self._batch[0])
                except asyncpg.exceptions.LockNotAvailableError as exc:
                    deferred.append(self._batch[0])
                    locked = exc
                self._batch.pop(0)
        finally:
            self._batch[:0] = deferred
        if locked is not None:
            raise locked

    async def _write_row(self, result: AttemptResult) -> None:
        """One outcome alone. Refused by the database, it is recorded as a failed attempt
        instead; refused again, it is left to the rescue."""
        try:
            written = await self._q.job_finish_many(self.shared, [result])
        except Exception as exc:
            if classify(exc) != "rejected":
                raise
            result = self._refused(result, exc)
            try:
                written = await self._q.job_finish_many(self.shared, [result])
            except Exception as again:
                if classify(again) != "rejected":
                    raise
                self._log.error(
                    "outcome not written: the job will be rescued when its lease expires",
                    job_id=result.job_id,
                    attempt=result.attempt,
                    correlation_id=result.correlation_id,
                    error=describe(again),
                )
                self.dropped += 1
                self._on_settled(result, None)
                return
        await self._settle([result], written, uncertain=self._uncertain)

    def _refused(self, result: AttemptResult, exc: BaseException) -> AttemptResult:
        """The failed attempt recorded in place of an outcome the database refused."""
        error = describe(exc)[:500]
        self._log.error(
            "outcome refused by the database: recording the attempt as failed",
            **_keys(result),
            error=error,
        )
        return AttemptResult(
            result.job_id,
            result.attempt,
            result.claimed_at,
            JobStatus.FAILED,
            Outcome.FAILED,
            error_type="OutcomeRefused",
            error_message=f"the database refused this attempt's outcome ({error})",
            correlation_id=result.correlation_id,
        )

    async def _settle(
        self, batch: list[AttemptResult], written: dict[int, str], *, uncertain: bool = False
    ) -> None:
        """Account for a written batch: requeued jobs wake the producer at their time; outcomes
        not written were fenced, unless a try lost with its connection (`uncertain`) had
        committed them: asked on the shared connection, since the worker's pool has no third
        one to lend. `on_settled` learns each attempt's outcome as its row holds it (None: not
        written), which the metrics count."""
        missing = [r for r in batch if r.job_id not in written]
        if missing and uncertain:
            with contextlib.suppress(Exception):
                recorded = await self._q.attempt_outcomes(
                    self.shared, [(r.job_id, r.attempt, r.claimed_at) for r in missing]
                )
                for r in missing:
                    outcome = recorded.get(r.job_id)
                    if outcome is not None and _kept(r, outcome):
                        written[r.job_id] = outcome
        self.written += len(written)
        for r in batch:
            self._on_settled(r, written.get(r.job_id))
            if r.job_id in written:
                if r.status is JobStatus.PENDING and written[r.job_id] != Outcome.CANCELLED:
                    self._on_requeued(r.delay)
            else:
                self.dropped += 1
                self._log.warning(
                    "outcome dropped: this attempt no longer holds the job", **_keys(r)
                )
        waiting = [
            r.job_id
            for r in batch
            if r.outcome is Outcome.WAITING and written.get(r.job_id) == Outcome.WAITING
        ]
        if waiting:
            await self._woken(waiting)
        await self._wake(self._freed(batch))

    async def _woken(self, ids: list[int]) -> None:
        """Attempts ended waiting for an event that an emit delivered meanwhile: their jobs are
        due now, and the emit's notification came while they still ran. This worker claims
        them (it serves them): its producer is woken. Only for waiting outcomes; the poll covers
        a query that fails."""
        with contextlib.suppress(Exception):
            if await self._q.jobs_woken(self.shared, ids):
                self._on_requeued(0.0)

    async def _wake(self, ended: Sequence[tuple[int, str, str]]) -> None:
        """Jobs claimed under a limit ended (id, queue, type): pass their room on to the workers
        that a limit may have held back (the poll covers a notification that cannot be sent)."""
        if ended:
            with contextlib.suppress(Exception):
                await self._q.jobs_announce(self.shared, ended)


def _kept(result: AttemptResult, recorded: str | None) -> bool:
    """Whether the attempt row holds this outcome: as sent, or `cancelled` for one that did not
    complete a job whose cancellation was asked for (job_finish_many.sql ends it so)."""
    if recorded == result.outcome:
        return True
    return recorded == Outcome.CANCELLED and result.status is not JobStatus.COMPLETED


def _keys(result: AttemptResult) -> dict[str, Any]:
    """The fields of a log line about an outcome."""
    return {
        "job_id": result.job_id,
        "attempt": result.attempt,
        "correlation_id": result.correlation_id,
        "outcome": result.outcome.value,
    }
