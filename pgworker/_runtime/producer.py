"""Claim as many due jobs as there are free slots, in one statement, and hand them to
`concurrency` slot tasks; their outcomes go to the completer, which writes them on a connection of
its own while the next claim runs. Keep the leases of running attempts. Stopping has two steps:
stop claiming at once; after the grace period, stop the attempts still running (they go back to
pending as `interrupted`). With a listener, idle workers take turns to claim and to poll
(_turns.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import anyio
import asyncpg
import structlog

from .. import _tracing
from .._attempt import Attempt
from .._db.connection import HeldConnection, SharedConnection, recover
from .._db.queries import attempt_conflict, queries
from .._logs import get_logger
from .._redact import redactor
from .._steps.store import StepStore
from ..models import AttemptResult, JobStatus, Outcome
from ..registry import Registry, served_key
from ..settings import Settings
from .completer import Completer
from .executor import execute, failed_by_worker
from .fleet_limits import LimitedClaims, wake_ups
from .notifier import Wakeup
from .service import Health, supervise
from .turns import Turns

if TYPE_CHECKING:
    from .metrics import Metrics

T = TypeVar("T")

ABANDON_AFTER = 5.0
"""Seconds an interrupted handler gets to end before the worker stops waiting for it."""
AHEAD_MOST = 4
"""The most jobs claimed ahead, in multiples of the concurrency."""
AVERAGE_WEIGHT = 0.1
"""The weight of the newest figure in the running averages of run time and claim time."""


class ClaimAhead:
    """How many jobs of each type to claim beyond the free slots, so that the next claim runs
    while the slots still work rather than after them, and claims are larger: as many as the
    slots end during one claim's round trip (AHEAD_MOST times the concurrency at most), judged
    by the type's own run times, and none of a type whose handlers take longer than that, or
    that has not run here yet. Only jobs of types that end faster than a claim wait in the
    worker, each about one claim's time at most."""

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._run: dict[str, float] = {}
        self._claim: float | None = None
        self.jobs = 0
        """The most jobs of any type claimed ahead."""

    def ran(self, type_: str, seconds: float) -> None:
        run = self._run.get(type_)
        self._run[type_] = seconds if run is None else run + AVERAGE_WEIGHT * (seconds - run)

    def claimed(self, seconds: float) -> None:
        claim = self._claim
        self._claim = seconds if claim is None else claim + AVERAGE_WEIGHT * (seconds - claim)
        self.jobs = max(map(self.of, self._run), default=0)

    def of(self, type_: str) -> int:
        run = self._run.get(type_)
        if run is None or self._claim is None:
            return 0
        most = self._concurrency * AHEAD_MOST
        if run * most <= self._claim * self._concurrency:
            return most
        return int(self._concurrency * self._claim / run)


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
        self._types = [t.name for t in registry]
        self._default_max_retries = [t.retry.max_retries for t in registry]
        self.limited = LimitedClaims(registry, settings, self._q)
        # The (type, payload version) pairs claimed: version 1 by type name, the others (none
        # unless a task declares a version or upgraders) as `type@version`. Tasks with limits
        # are claimed apart (_runtime/fleet_limits.py).
        served = registry.served()
        plain = [(t, v) for t, v in served if t not in self.limited.limited_types]
        self._version_1_types = [t for t, v in plain if v == 1]
        self._other_versions = [served_key(t, v) for t, v in plain if v != 1]
        self._served = [served_key(t, v) for t, v in served]
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
        self._ahead = ClaimAhead(settings.concurrency)
        self._stopping = anyio.Event()
        self._drained = anyio.Event()
        self._saturated = False
        self._polled = False
        self._next_due = float("inf")
        self._log = get_logger(worker_id=settings.worker_id)
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

    def freed(self, batch: list[AttemptResult]) -> list[str]:
        """The outcomes of this batch are written: claim again if a limit held their jobs, and
        the notifications (the completer sends them) that pass on the room this worker cannot
        take."""
        ends = self.limited.freed(batch)
        if not ends:
            return []
        self._wakeup.set()
        own = 0 if self._stopping.is_set() or self._cut_off else self._settings.concurrency
        return wake_ups(ends, own - len(self.running))

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
                self.limited.forget(attempt.id)
            else:
                result = attempt.ends(JobStatus.PENDING, Outcome.INTERRUPTED)
                if self._metrics is not None:
                    self._metrics.finished(attempt, result, time.monotonic())
                self._completer.submit(result)
            self._forget(attempt)

    # The claim service: one claim per step, as many jobs as there are free slots.

    def done(self) -> bool:
        return self._stopping.is_set()

    async def reset(self, exc: Exception) -> None:
        await self._conn.drop()
        await recover(self._pool, exc)

    def _room(self) -> int:
        """How many jobs the next claim asks for: the free slots, plus the jobs claimed ahead
        (ClaimAhead); 0 while claimed jobs still cover the next claim's round trip."""
        ahead = self._ahead.jobs
        room = self._settings.concurrency + ahead - len(self.running)
        return room if room >= max(ahead, 1) else 0

    async def step(self) -> None:
        s = self._settings
        self._wakeup.clear()
        free = self._room()
        if free <= 0 or self._cut_off:
            return
        if self._polled or (self._turns is not None and self._turns.take_bare()):
            self.limited.stale = True
        records: list[asyncpg.Record] = []
        # Limits count claimed jobs as running: none is claimed ahead of a free slot.
        slots = s.concurrency - len(self.running)
        if slots > 0 and self.limited.wanted():
            # Limited jobs first: the plain claim would otherwise take every free slot for as
            # long as plain work waits.
            limited, wait = await self._claiming(
                self.limited.claim(await self._conn.get(), slots), ([], None)
            )
            if wait is not None:
                self.requeued(max(wait, 0.0))
            records += self._started(limited)
        if len(records) < free and (self._version_1_types or self._other_versions):
            slots = max(slots - len(records), 0)
            # Each type's most, fixed for this claim: the averages move once it returns.
            caps = {t: slots + self._ahead.of(t) for t in self._types}
            began = time.monotonic()
            plain = await self._claiming(
                self._q.job_claim(
                    await self._conn.get(),
                    queues=s.served_queues,
                    types=self._types,
                    default_max_retries=self._default_max_retries,
                    limit=free - len(records),
                    worker_id=s.worker_id,
                    lease=s.lease,
                    code_version=s.code_version,
                    durable=s.durable_claims,
                    version_1_types=self._version_1_types,
                    other_versions=self._other_versions,
                    most=caps.__getitem__,
                ),
                [],
            )
            self._ahead.claimed(time.monotonic() - began)
            records += self._started(plain)
            # A type that got all it could (its jobs claimed ahead are capped) may have more.
            capped = Counter(r["type"] for r in plain)
            saturated = any(n >= caps[t] for t, n in capped.items())
        else:
            saturated = False
        self._saturated = saturated or len(records) == free
        if self.cut_off():  # claimed by a statement sent before the worker was fenced
            self.fence()
        elif self._polled and self._saturated and self._turns is not None and self._turns.shared:
            # Work no notification announced (jobs that became due): share it at once rather
            # than one worker per poll slot.
            conn = await self._conn.get()
            for queue in sorted({r["queue"] for r in records}):
                await self._q.notify(conn, self._q.jobs_channel, queue)

    async def _claiming(self, claim: Awaitable[T], empty: T) -> T:
        """The claim's result; `empty` when a job's attempt number was taken (its `attempts`
        was reset by hand), which is repaired for the next claim."""
        try:
            return await claim
        except asyncpg.exceptions.UniqueViolationError as exc:
            job_id = attempt_conflict(exc)
            if job_id is None:
                raise
            self._log.warning(
                "a job's attempts counter was behind its attempt rows (reset by hand): "
                "its next attempt is numbered after the last",
                job_id=job_id,
            )
            await self._q.job_attempts_repair(self.shared, job_id)
            self._wakeup.set()
            return empty

    def _started(self, records: list[asyncpg.Record]) -> list[asyncpg.Record]:
        """Hand the claimed jobs to the slots, as soon as each claim returns."""
        if self._metrics is not None:
            self._metrics.claimed(records)
        for record in records:
            self._start(Attempt(record, self._steps))
        return records

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
                self._ahead.ran(attempt.type, result.run_ms / 1000)
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
            self.limited.forget(attempt.id)
            return True
        return False

    def _forget(self, attempt: Attempt) -> None:
        self.running.discard(attempt)
        if self._by_job.get(attempt.id) is attempt:
            del self._by_job[attempt.id]
        if self._saturated and self._room():
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
