"""Claim as many due jobs as the worker has room for (claimer.py), and hand them to
`concurrency` slot tasks; their outcomes go to the completer, which writes them on a connection of
its own while the next claim runs. Keep the leases of running attempts. Stopping has two steps:
stop claiming at once; after the grace period, stop the attempts still running (they go back to
pending as `interrupted`). With a listener, idle workers take turns to claim and to poll
(turns.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
import asyncpg
import structlog

from .. import _tracing
from .._attempt import Attempt
from .._db.connection import HeldConnection, SharedConnection, recover
from .._db.queries import Row, queries
from .._logs import get_logger
from .._redact import redactor
from .._steps.store import StepStore
from ..models import AttemptResult, JobStatus, Outcome
from ..registry import Registry, served_key
from ..settings import Settings
from .claimer import Claimer
from .completer import Completer
from .executor import execute, failed_by_worker
from .notifier import Wakeup
from .service import Health, supervise
from .turns import Turns

if TYPE_CHECKING:
    from .metrics import Metrics

ABANDON_AFTER = 5.0
"""Seconds an interrupted handler gets to end before the worker stops waiting for it."""


class _Handoff:
    """Claimed attempts on their way to idle slots: a queue without a checkpoint per item, and one
    event per batch rather than one per waiting slot."""

    def __init__(self) -> None:
        self._items: deque[Attempt] = deque()
        self._ready = anyio.Event()
        self._closed = False

    def put(self, attempt: Attempt) -> None:
        self._items.append(attempt)
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    def take_all(self) -> list[Attempt]:
        """The attempts no slot has taken yet, removed."""
        items = list(self._items)
        self._items.clear()
        return items

    @property
    def closed(self) -> bool:
        return self._closed

    async def get(self) -> Attempt | None:
        """The next attempt, or None once closed."""
        while not self._items:
            if self._closed:
                return None
            if self._ready.is_set():
                self._ready = anyio.Event()
            await self._ready.wait()
        return self._items.popleft()


class Producer:
    """The claim service (see service.py) and the slots that run what it claims."""

    name = "producer"

    def __init__(
        self,
        pool: asyncpg.Pool,
        registry: Registry,
        settings: Settings,
        completer: Completer,
        wakeup: Wakeup,
        metrics: Metrics | None = None,
        turns: Turns | None = None,
    ) -> None:
        self._pool = pool
        self._turns = turns
        if turns is not None:
            turns.full = lambda: len(self.running) >= settings.concurrency
        self._metrics = metrics
        self._conn = HeldConnection(pool)
        self._q = queries(settings.schema)
        self._registry = registry
        self._settings = settings
        self._completer = completer
        self._wakeup = wakeup
        self._log = get_logger(worker_id=settings.worker_id)
        self._claimer = Claimer(
            registry, settings, self._q, completer.shared, self._log, self._started
        )
        self._served = [served_key(t, v) for t, v in registry.served()]
        self._steps = StepStore(
            settings.dsn,
            settings.schema,
            settings.concurrency,
            settings.worker_id,
            pooler=settings.pooler,
            shared=completer.shared,
        )
        self._redact = redactor(settings.redact_keys)
        self._handoff = _Handoff()
        self._stopping = anyio.Event()
        self._drained = anyio.Event()
        self._saturated = False
        self._polled = False
        self._next_due = float("inf")
        # Attempts in flight, keyed by attempt (a job rescued from under a frozen attempt and
        # claimed again here has two); and the newest attempt of each job, for cancel requests.
        self.running: set[Attempt] = set()
        self._by_job: dict[int, Attempt] = {}
        # Attempts stopped because the worker lost contact with the database (`fence`), and
        # whether it is cut off now (no claims).
        self.fenced: set[Attempt] = set()
        self._cut_off = False
        self._slots: set[asyncio.Task[None]] = set()
        self.abandoned = 0

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    @property
    def shared(self) -> SharedConnection:
        """The connection the outcomes, the heartbeat, the maintenance and the steps' records
        take turns on (the completer's)."""
        return self._completer.shared

    @property
    def served(self) -> list[str]:
        """The (type, version) pairs served, as `workers.types` holds them (served_key)."""
        return self._served

    def unwritten(self) -> list[tuple[int, int, datetime]]:
        """(job id, attempt, claimed at) of the attempts whose outcome waits to be written."""
        return self._completer.unwritten()

    def stop(self) -> None:
        """Stop claiming now; running attempts get the grace period to finish, their handlers
        told at once (`ctx.stopping`)."""
        if not self._stopping.is_set():
            self._stopping.set()
            self._hand_back_waiting()
            self._ask_to_stop()
        self._wakeup.set()

    def _hand_back_waiting(self) -> None:
        """The attempts claimed ahead that no slot started go back at once, `interrupted`, for
        other workers to take."""
        for attempt in self._handoff.take_all():
            result = attempt.ends(JobStatus.PENDING, Outcome.INTERRUPTED)
            if self._metrics is not None:
                self._metrics.finished(attempt, result, time.monotonic())
            self._completer.submit(result)
            self._forget(attempt)

    def _ask_to_stop(self) -> None:
        for attempt in list(self.running):
            attempt.ask_to_stop()

    def interrupt(self) -> None:
        """End the grace period now: stop every running attempt."""
        self.stop()
        for attempt in list(self.running):
            attempt.stop(Outcome.INTERRUPTED)

    def cancel(self, job_id: int) -> None:
        """An operator cancelled this job: stop its attempt if it runs here."""
        attempt = self._by_job.get(job_id)
        if attempt is not None and attempt.stopped_as is None:
            attempt.log.info("cancel requested: stopping the job")
            attempt.stop(Outcome.CANCELLED)

    def fence(self) -> int:
        """The worker cannot renew its leases (see Heartbeat.guard): stop claiming, and stop every
        running attempt as `lost`, its outcome not written (the database cannot be reached, and
        the rescue records the attempt). Returns how many attempts were stopped."""
        self._cut_off = True
        # Statements waiting on a network that drops packets could wait for minutes after it
        # heals: the next claim and outcome write take new connections.
        self._conn.abandon()
        self._completer.abandon_connection()
        for attempt in self.running:
            self.fenced.add(attempt)
            attempt.stop(Outcome.LOST)
        return len(self.running)

    def cut_off(self) -> bool:
        """Whether the worker is fenced now (it claims nothing)."""
        return self._cut_off

    def unfence(self) -> None:
        """The database answers again: claim again."""
        self._cut_off = False
        self._wakeup.set()

    def room_to_pass_on(self, batch: list[AttemptResult]) -> Sequence[tuple[int, str, str]]:
        """The outcomes of this batch are written: claim again if a limit held their jobs. Returns
        the (id, queue, type) of those jobs when they freed more room than this worker takes
        itself (its free slots, claimed at once; none while it stops or is fenced): the
        completer announces them as new jobs, so that the next workers in turn claim
        (Queries.jobs_announce)."""
        ended = self._claimer.limited.freed(batch)
        if not ended:
            return []
        self._wakeup.set()
        own = 0 if self._stopping.is_set() or self._cut_off else self._settings.concurrency
        return ended if len(ended) > own - len(self.running) else []

    def requeued(self, delay: float) -> None:
        """A job of ours went back to pending, due in `delay` seconds: claim it then rather than
        at the next poll."""
        due = anyio.current_time() + delay
        if due < self._next_due:
            self._next_due = due
            self._wakeup.set()

    async def run(self, health: Health) -> None:
        """Claim until stopped, feeding the attempts to `concurrency` slot tasks; then give running
        attempts the grace period, and interrupt what still runs after it. Cancelled from outside,
        hand running attempts back at once."""
        for _ in range(self._settings.concurrency):
            self._spawn_slot()
        try:
            try:
                await supervise(self, health, self._log, self._stopping)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._conn.drop()
            self._ask_to_stop()  # those a claim in flight at `stop` started
            await self._leave()
            await self._drain()
        except BaseException:
            self.interrupt()
            raise
        finally:
            self.stop()
            self._handoff.close()
            with anyio.CancelScope(shield=True):
                await self._join_slots()
                await self._steps.close()

    def _spawn_slot(self) -> None:
        """Slots are tasks of their own, not children of a task group: a handler that ignores
        its cancellation can then be abandoned at shutdown rather than hold the worker forever
        (Python cannot stop it, only stop waiting for it)."""
        slot = asyncio.get_running_loop().create_task(self._slot(), name="pgworker-slot")
        self._slots.add(slot)
        slot.add_done_callback(self._slots.discard)

    async def _join_slots(self) -> None:
        """Wait for the slots to end; after ABANDON_AFTER, abandon those whose handler ignores its
        cancellation, handing their jobs back."""
        if not self._slots:
            return
        _, stuck = await asyncio.wait(set(self._slots), timeout=ABANDON_AFTER)
        if not stuck:
            return
        self.abandoned += len(stuck)
        for attempt in list(self.running):
            attempt.log.error(
                "handler ignored its cancellation: abandoned, its job handed back",
                waited_s=ABANDON_AFTER,
            )
            if attempt in self.fenced:  # left to the rescue
                self.fenced.discard(attempt)
                self._claimer.limited.forget(attempt.id)
            else:
                result = attempt.ends(JobStatus.PENDING, Outcome.INTERRUPTED)
                if self._metrics is not None:
                    self._metrics.finished(attempt, result, time.monotonic())
                self._completer.submit(result)
            self._forget(attempt)

    # The claim service (service.py): one claim per step.

    def stopped(self) -> bool:
        """Whether the worker stopped claiming (`stop`): the claim service takes no more steps,
        while the slots still run what was claimed, until the grace period ends."""
        return self._stopping.is_set()

    async def reset(self, exc: Exception) -> None:
        await self._conn.drop()
        await recover(self._pool, exc)

    def _free(self) -> int:
        """The slots no attempt holds (fewer than none while jobs claimed ahead wait)."""
        return self._settings.concurrency - len(self.running)

    async def step(self) -> None:
        """One claim: as many jobs as the worker has room for (Claimer.claim), each handed to the
        slots as its statement returns. A poll or a queue's bare notification may mean new
        limits, read again by this claim; a rate window that held jobs back schedules the next
        claim. A claim that filled the room after a poll found work no notification announced
        (jobs that became due): it wakes the other workers of those queues at once, rather than
        one per poll slot."""
        self._wakeup.clear()
        free = self._free()
        if self._cut_off or not self._claimer.room(free):
            return
        if self._polled or (self._turns is not None and self._turns.take_bare()):
            self._claimer.limits_changed()
        claimed = await self._claimer.claim(await self._conn.get(), free)
        if claimed.wait is not None:
            self.requeued(max(claimed.wait, 0.0))
        if claimed.again:
            self._wakeup.set()
        self._saturated = claimed.saturated
        if self.cut_off():  # claimed by a statement sent before the worker was fenced
            self.fence()
        elif self._polled and self._saturated and self._turns is not None and self._turns.shared:
            await self._share(claimed.rows)

    async def _share(self, rows: Sequence[Row]) -> None:
        """Wake every worker of the queues of these jobs (a bare queue name)."""
        conn = await self._conn.get()
        for queue in sorted({r["queue"] for r in rows}):
            await self._q.notify(conn, self._q.jobs_channel, queue)

    def _started(self, records: list[Row]) -> None:
        """Hand the claimed jobs to the slots, as soon as each claim returns."""
        if self._metrics is not None:
            self._metrics.claimed(records)
        for record in records:
            self._start(Attempt(record, self._steps))

    def _start(self, attempt: Attempt) -> None:
        stale = self._by_job.get(attempt.id)
        if stale is not None:
            # Rescued while this worker was frozen or cut off, and claimed again: the old attempt
            # no longer holds the job, whatever its handler is doing.
            stale.log.warning("lease lost: stopping the attempt", claimed_again=attempt.number)
            stale.stop(Outcome.LOST)
        self.running.add(attempt)
        self._by_job[attempt.id] = attempt
        self._handoff.put(attempt)

    async def idle(self) -> None:
        now = anyio.current_time()
        if self._next_due <= now:
            self._next_due = float("inf")
        self._polled = False
        while True:
            interval = self._settings.poll_interval
            poll = interval if self._turns is None else self._turns.poll_delay(time.time())
            due = max(self._next_due - anyio.current_time(), 0.0)
            # Taking turns, wait one interval at most: the list of workers, and so this worker's
            # slot, may change meanwhile.
            wait = min(poll, due, interval)
            if await self._wakeup.wait(wait) or due <= wait:
                return
            if poll <= wait:
                self._polled = True
                if self._turns is not None:
                    self._turns.polled()
                return

    async def _leave(self) -> None:
        """Tell the other workers this one no longer claims, so that its turns pass to them
        while it drains. Best effort, and short: a worker that cannot say it is leaving is
        covered by the polls."""
        if self._turns is None or not self._turns.shared:
            return
        with anyio.move_on_after(1.0), contextlib.suppress(Exception):
            await self._q.notify(self._pool, self._q.jobs_channel, self._turns.bye)

    async def _drain(self) -> None:
        s = self._settings
        if not self.running:
            return
        self._log.info(
            "stopping: waiting for running jobs", jobs=len(self.running), grace_s=s.shutdown_timeout
        )
        with anyio.move_on_after(s.shutdown_timeout):
            await self._drained.wait()
        if self.running:
            self._log.warning("grace period over: interrupting jobs", jobs=len(self.running))
            self.interrupt()

    async def _slot(self) -> None:
        """One of `concurrency` long-lived tasks, each running one attempt at a time: cheaper than
        a task per job, and the bound on concurrency by construction. Each attempt starts from
        the slot's own structlog context plus the job's keys, so that nothing a handler binds
        reaches the next job. A cancellation a handler leaves on the task (it cancelled the task
        it runs in, or left a timeout armed) is absorbed; a task a handler left in a state that
        cannot be trusted (an anyio cancel scope left entered) is replaced."""
        keys = ("job_id", "attempt", "correlation_id", "worker_id")
        inherited = {
            k: v for k, v in structlog.contextvars.get_contextvars().items() if k not in keys
        }
        me = asyncio.current_task()
        assert me is not None
        while True:
            try:
                attempt = await self._handoff.get()
            except asyncio.CancelledError:
                if self._handoff.closed:
                    raise
                _forget_cancellation(me)
                continue
            if attempt is None:
                return
            structlog.contextvars.clear_contextvars()
            structlog.contextvars.bind_contextvars(**inherited, **attempt.keys)
            sound = await self._execute(attempt)
            if me.cancelling():
                await _absorb_cancellation(me)
            if not sound:
                self._spawn_slot()
                return

    async def _execute(self, attempt: Attempt) -> bool:
        """Run the attempt and submit its outcome; False when pgworker itself failed to run it
        to the end, which leaves this slot's task suspect."""
        task = self._registry[attempt.type]
        sound = True
        span = _tracing.start(attempt, self._settings.worker_id)  # None unless traced
        result = None
        try:
            try:
                result = await execute(attempt, task, self._settings.worker_id, self._redact)
            except BaseException as exc:  # not the handler's: its exceptions are its outcome
                sound = False
                result = failed_by_worker(attempt, task, exc, self._redact)
                with contextlib.suppress(BaseException):
                    self._log.error("internal error running a job", job_id=attempt.id, exc_info=exc)
            if result.run_ms is not None:
                self._claimer.ahead.ran(attempt.type, result.run_ms / 1000)
            if not (self.fenced and self._fenced_out(attempt, result)):
                if self._metrics is not None:  # before the completer can settle it
                    self._metrics.finished(attempt, result, time.monotonic())
                self._completer.submit(result)
        finally:
            if span is not None:
                span.end(result)
            self._forget(attempt)
        return sound and not attempt.task_cancelled

    def _fenced_out(self, attempt: Attempt, result: AttemptResult) -> bool:
        """Whether the attempt was stopped by the fence, its outcome not to be written: the
        rescue closes it as `lost`. One whose handler ended on its own before it heard of the
        fence has its outcome written as any other (fenced in the database if too late)."""
        if attempt not in self.fenced:
            return False
        self.fenced.discard(attempt)
        if result.outcome is Outcome.LOST:
            self._claimer.limited.forget(attempt.id)
            return True
        return False

    def _forget(self, attempt: Attempt) -> None:
        self.running.discard(attempt)
        if self._by_job.get(attempt.id) is attempt:
            del self._by_job[attempt.id]
        if self._saturated and self._claimer.room(self._free()):
            self._wakeup.set()
        if self._stopping.is_set() and not self.running:
            self._drained.set()


def _forget_cancellation(task: asyncio.Task[None]) -> None:
    while task.cancelling():
        task.uncancel()


async def _absorb_cancellation(task: asyncio.Task[None]) -> None:
    """Take a cancellation a handler requested on its slot's task before the next job runs."""
    _forget_cancellation(task)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(0)
    _forget_cancellation(task)
