"""The attempt's data: what the executor runs, the handler's context reads, its steps fence their
writes with and its span describes; and the correlation id of the job running in the current
context, which jobs enqueued from a handler inherit. Below all of them, so that each reads it
without importing the others."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio

from ._logs import get_logger
from ._redact import describe
from .models import AttemptResult, Job, JobStatus, Outcome

if TYPE_CHECKING:
    from ._steps.store import StepStore
    from ._task import Task

current_correlation_id: ContextVar[str | None] = ContextVar("pgworker_correlation_id", default=None)
"""The correlation id of the job running in this context, inherited by jobs it enqueues."""


class WaitingForEvent(BaseException):
    """Ends an attempt whose handler waits for an event (ctx.wait_for_event): the executor turns
    it into the `waiting` outcome. A BaseException, like asyncio.CancelledError, so that a
    handler's `except Exception` does not swallow it; `except BaseException` must re-raise it.
    `delay`: seconds until the wait's deadline, infinity without one."""

    def __init__(self, name: str, delay: float) -> None:
        super().__init__(f"waiting for event {name!r}")
        self.name = name
        self.delay = delay


class Attempt:
    """A running attempt as the worker sees it; `stop(outcome)` cancels just this job. It reads
    the few fields the worker needs from the claimed row; the full Job is built when first asked
    for, which most handlers never do."""

    __slots__ = (
        "_job",
        "_log",
        "_record",
        "claimed_at",
        "correlation_id",
        "id",
        "keys",
        "max_retries",
        "number",
        "parents",
        "payload",
        "payload_error",
        "queue",
        "retry_count",
        "scope",
        "started",
        "stopped_as",
        "stopping",
        "store",
        "task_cancelled",
        "type",
    )

    def __init__(self, record: Any, store: StepStore | None = None) -> None:
        """`record` is a row of job_claim.sql: the job as its claim left it; `store` is where its
        steps and milestones go (see _steps.py)."""
        self._record = record
        self.store = store
        self._job: Job | None = None
        self.id: int = record["id"]
        self.number: int = record["attempts"]
        self.claimed_at: datetime = record["claimed_at"]
        self.type: str = record["type"]
        self.queue: str = record["queue"]
        self.payload: Any = None
        self.payload_error: str | None = None
        try:
            self.payload = json.loads(record["payload"])
        except Exception as exc:  # a row written around enqueue's checks, e.g. nested too deep
            self.payload_error = describe(exc)
        self.retry_count: int = record["retry_count"]
        self.max_retries: int | None = record["max_retries"]
        self.correlation_id: str = record["correlation_id"]
        self.keys = {
            "job_id": self.id,
            "attempt": self.number,
            "correlation_id": self.correlation_id,
            "worker_id": record["worker_id"],
        }
        self.scope = anyio.CancelScope()
        self.started: float | None = None  # time.monotonic() when the handler was called
        self.stopped_as: Outcome | None = None
        self.stopping: Stopping | None = None  # made when first read (`ctx.stopping`)
        self.task_cancelled = False
        self._log: Any = None
        self.parents: dict[int, Job] | None = None  # read by load_parents, for jobs with parents

    @property
    def job(self) -> Job:
        """The job as the claim left it."""
        if self._job is None:
            self._job = Job.from_record(self._record, payload=self.payload)
        return self._job

    @property
    def scheduled_at(self) -> datetime | None:
        """The slot of a periodic job (see _periodic.py); None for any other job."""
        slot: datetime | None = self._record["scheduled_at"]
        return slot

    @property
    def progress(self) -> str | None:
        """The job's progress (JSON text) as the claim found it: the last milestone before this
        attempt."""
        progress: str | None = self._record["progress"]
        return progress

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent stored at enqueue, that the attempt's span links to."""
        traceparent: str | None = self._record["traceparent"]
        return traceparent

    @property
    def log(self) -> Any:
        """The logger bound to the job's keys, made when first needed."""
        if self._log is None:
            self._log = get_logger(**self.keys)
        return self._log

    def ends(
        self,
        status: JobStatus,
        outcome: Outcome,
        result: str | None = None,
        error_type: str | None = None,
        error_message: str | None = None,
        delay: float = 0.0,
        retried: int = 0,
        error_detail: str | None = None,
    ) -> AttemptResult:
        """This attempt's result: the job's next status, the attempt's outcome, and the other
        fields of AttemptResult (built positionally: one is made per job). Its run time, one
        definition everywhere (log, job_attempts.run_ms, CLI, dashboard): from the handler's
        call to this decision, None before the call."""
        started = self.started
        return AttemptResult(
            self.id,
            self.number,
            self.claimed_at,
            status,
            outcome,
            result,
            error_type,
            error_message,
            delay,
            retried,
            self.correlation_id,
            error_detail,
            None if started is None else round((time.monotonic() - started) * 1000, 1),
        )

    def budget_elapsed(self) -> float | None:
        """Seconds since the job's retry budget started (its first claim, or first since a
        replay), on the database's clock up to this claim and on this process's since; None when
        the row has no start."""
        started_at: datetime | None = self._record["budget_started_at"]
        if started_at is None:
            return None
        running = 0.0 if self.started is None else time.monotonic() - self.started
        return (self.claimed_at - started_at).total_seconds() + running

    def upgrade(self, task: Task) -> None:
        """Bring the payload from the job's version to the task's through its upgraders (the
        claim took only versions they lead from); `ctx.payload` is then the upgraded one, and
        `ctx.job` keeps the row as stored (its payload decoded apart: an upgrader may change
        the one it is given)."""
        version = self._record["version"]
        if version < task.version:
            if self._job is None:
                self._job = Job.from_record(self._record)
            self.payload = task.upgraded(self.payload, version)

    @property
    def parent_ids(self) -> list[int] | None:
        """The ids of the job's parents (after=), or None."""
        ids: list[int] | None = self._record["parents"]
        return ids

    async def load_parents(self) -> None:
        """Read the parents of a job enqueued with after= (one query; none for other jobs):
        `ctx.parents`. A parent pruned since is missing."""
        ids = self.parent_ids
        if ids is None:
            return
        if self.store is None:
            self.parents = {}
            return
        rows = await self.store.q.job_parents_of(await self.store.writes(), ids)
        self.parents = {r["id"]: Job.from_record(r) for r in rows}

    def stop(self, outcome: Outcome) -> None:
        if self.stopped_as is None:
            self.stopped_as = outcome
        self.scope.cancel()
        # After the cancel: a flag made meanwhile in another thread reads cancel_called after
        # it is stored (see stopping_flag).
        flag = self.stopping
        if flag is not None:
            flag.set()

    def ask_to_stop(self) -> None:
        """The worker's shutdown began: `ctx.stopping` is set now, the attempt is stopped at the
        end of the grace period (`stop`) unless its handler returns before."""
        with _MAKING:
            if self.stopping is None:
                self.stopping = Stopping()
        self.stopping.set()

    def stopping_flag(self, loop: asyncio.AbstractEventLoop | None) -> Stopping:
        """`ctx.stopping`, made at its first read (from any thread): set at once when the attempt
        was stopped or asked to stop already, and armed to be set at the task's timeout on
        `loop` (None, read first by a thread an async handler started: set when the handler,
        cancelled at its timeout, has returned)."""
        with _MAKING:
            flag = self.stopping
            if flag is not None:
                return flag
            flag = self.stopping = Stopping()
            deadline = self.scope.deadline
        if self.scope.cancel_called:
            flag.set()
        elif deadline != float("inf") and loop is not None:
            if asyncio._get_running_loop() is loop:
                flag.arm(loop, deadline)
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to arm
                    loop.call_soon_threadsafe(flag.arm, loop, deadline)
        return flag


_MAKING = threading.Lock()
"""Held while an attempt's `stopping` flag is made: by the handler's thread, a thread of its own
or the worker's loop, whichever reads or sets it first."""


class Stopping:
    """`ctx.stopping`: set as soon as the worker asks the attempt to stop (the shutdown's grace
    period begins, an operator's cancel, the task's timeout, a lost lease or lost contact with
    the database). Read it like a `threading.Event`: `is_set()`, `wait(timeout)`; only the
    worker sets it."""

    __slots__ = ("_closed", "_event", "_timer")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def is_set(self) -> bool:
        """Whether the worker has asked this attempt to stop."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block this thread until the worker asks the attempt to stop, or `timeout` seconds
        pass; returns `is_set()`. From a plain `def` handler: `while not ctx.stopping.wait(1):`.
        An `async def` handler must not wait on it (that blocks the event loop): it reads
        `is_set()`, or is simply cancelled."""
        return self._event.wait(timeout)

    def set(self) -> None:
        """The worker's: the attempt is asked to stop."""
        self._event.set()

    def arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Set at `deadline` (the loop's clock): the task's timeout. On the loop's thread."""
        if not self._closed and not self._event.is_set():
            self._timer = loop.call_at(deadline, self._event.set)

    def close(self, stopped: bool) -> None:
        """The attempt has ended (`stopped`: by the worker): its timeout's timer is dropped. On
        the loop's thread."""
        if stopped:
            self._event.set()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __repr__(self) -> str:
        return f"<Stopping {'set' if self._event.is_set() else 'clear'}>"
