"""What a handler sees of the attempt it runs, and the correlation id of the job running in the
current context (jobs enqueued from a handler inherit it)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from ._attempt import Stopping
from ._attempt import current_correlation_id as current_correlation_id
from ._bridge import SyncStep
from ._steps.steps import Steps, step_name
from .errors import PgWorkerError
from .models import Job

if TYPE_CHECKING:
    from ._attempt import Attempt

T = TypeVar("T")


def _forward(path: str) -> Any:
    """A read-only attribute of the context that reads the attempt's (one line per field, and
    as fast as a hand-written property)."""
    return property(attrgetter(path))


class JobContext:
    """What a handler knows about the attempt it runs, and what it keeps across attempts: its
    durable steps and milestones. `log` is bound to the job's keys.

    Its coroutine methods (`step`, `transactional_step`, `progress`) are awaited by `async def`
    handlers; called from any other thread (a plain `def` handler, a thread a handler started)
    they run on the worker's event loop while the calling thread waits, and return their value
    (see `_call`)."""

    __slots__ = ("_attempt", "_loop", "_steps", "_thread", "_waiting", "worker_id")

    def __init__(self, attempt: Attempt, worker_id: str) -> None:
        self._attempt = attempt
        self.worker_id = worker_id
        self._steps: Steps | None = None  # made at the first step or milestone
        self._thread = threading.get_ident()  # the event loop's
        # The loop, for calls from other threads: set for a plain `def` handler (`_threaded`), or
        # at a read of `stopping` on the loop. Not read here: get_running_loop() costs several
        # times get_ident(), for every job.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: set[asyncio.Task[Any]] | None = None  # calls of threads, on the loop

    job: Job = _forward("_attempt.job")
    """The job as its claim left it."""
    job_id: int = _forward("_attempt.id")
    attempt: int = _forward("_attempt.number")
    """This attempt's number, from 1."""
    correlation_id: str = _forward("_attempt.correlation_id")
    payload: Any = _forward("_attempt.payload")
    type: str = _forward("_attempt.type")
    queue: str = _forward("_attempt.queue")
    log: Any = _forward("_attempt.log")
    """A logger bound to the job's keys."""
    scheduled_at: datetime | None = _forward("_attempt.scheduled_at")
    """The slot a periodic job was enqueued for (`registry.periodic`), timezone-aware in UTC;
    None for a job enqueued any other way. The same as `ctx.job.scheduled_at`."""

    @property
    def stopped(self) -> bool:
        """True once the worker has stopped this attempt: the task's timeout, an operator's
        cancel, the end of the shutdown grace period, a lost lease, or the worker losing contact
        with the database. An `async def` handler is cancelled then; a plain `def` handler, which
        Python cannot interrupt, should check it between units of work and return: its attempt
        has already ended, and what it returns or raises is ignored."""
        return self._attempt.scope.cancel_called

    @property
    def stopping(self) -> Stopping:
        """A `threading.Event`-like flag (`is_set()`, `wait(timeout)`), set as soon as the worker
        asks this attempt to stop: its shutdown begins (the grace period starts), an operator
        cancels the job, the task's timeout passes, the lease is lost or the worker loses the
        database. `stopped` follows when the stop takes effect: at once, but at the end of the
        grace period for a shutdown. A plain `def` handler that sees it and returns within the
        grace period ends as it returned; made at its first read."""
        flag = self._attempt.stopping
        if flag is None:
            if self._loop is None and threading.get_ident() == self._thread:
                self._loop = asyncio.get_running_loop()
            flag = self._attempt.stopping_flag(self._loop)
        return flag

    def _threaded(self) -> None:
        """The handler runs in a thread (a plain `def`): its calls will need the loop."""
        self._loop = asyncio.get_running_loop()

    def _call(self, what: str, make: Callable[[], Awaitable[T]]) -> Any:
        """`make()`, the awaitable of a coroutine method, for the caller to await when called on
        the worker's event loop; from any other thread, run on the loop while this thread waits,
        its value returned and its exception raised. A call waiting when the attempt is stopped
        (or made after) raises CancelledError in the thread, as the awaited one would."""
        if threading.get_ident() == self._thread:
            return make()
        return self._blocking(what, make)

    def _blocking(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        attempt = self._attempt
        loop = self._loop
        if loop is None:
            raise PgWorkerError(
                f"ctx.{what} called from a thread an `async def` handler started: await it in "
                "the handler (a plain `def` handler, and the threads it starts, may call it)"
            )

        async def on_loop() -> T:
            if attempt.scope.cancel_called:
                raise asyncio.CancelledError
            task = asyncio.current_task()
            assert task is not None
            if self._waiting is None:
                self._waiting = set()
            self._waiting.add(task)
            try:
                return await make()
            finally:
                self._waiting.discard(task)

        try:
            future = asyncio.run_coroutine_threadsafe(on_loop(), loop)
        except RuntimeError:  # the loop is closed: the worker is gone
            raise self._stopped(what) from None
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise self._stopped(what) from None

    def _stopped(self, what: str) -> asyncio.CancelledError:
        return asyncio.CancelledError(
            f"ctx.{what}: job {self._attempt.id}, attempt {self._attempt.number} was stopped by "
            "the worker; the handler should return"
        )

    def _release(self) -> None:
        """The handler's thread has returned or been left behind: calls its threads still wait
        on are cancelled (they raise CancelledError there). On the loop."""
        waiting = self._waiting
        if waiting:
            for task in waiting:
                task.cancel()

    def _attempt_steps(self, what: str) -> Steps:
        """The attempt's steps, made at the first step or milestone, for `ctx.<what>(...)` on the
        worker's event loop: a coroutine method reaches it inside `_call`'s `make`. Called
        from another thread, its coroutine would never be awaited (nothing done, silently): an
        error at once instead."""
        if threading.get_ident() != self._thread:
            raise PgWorkerError(
                f"ctx.{what} cannot be called from a thread (a plain `def` handler): make the "
                "handler `async def`"
            )
        if self._steps is None:
            self._steps = Steps(self._attempt)
        return self._steps

    def step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Awaitable[Any]:
        """`fn(*args, **kwargs)` run at most once per job and `name`: its result is stored in
        `job_steps` under the attempt's fence, and a later attempt gets it back without calling
        `fn`. `fn` may be async, or a plain function (run in a thread). A step that raises
        stores nothing and runs again on the next attempt. The result must be JSON-serialisable
        (else a ValidationError naming the step, nothing stored); it is returned as stored (a
        tuple comes back a list), the first time as on later attempts. A name used again in the
        same attempt returns the stored result without calling `fn`. Raises PgWorkerError, and
        records nothing, once this attempt no longer holds its job (the handler should let it
        propagate). Awaited from `async def` handlers; from a plain `def` handler it blocks and
        returns the result. Tasks of one handler running the same step at once run it once."""
        return self._call(  # type: ignore[no-any-return]
            "step", lambda: self._attempt_steps("step").step(name, fn, args, kwargs)
        )

    def transactional_step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Awaitable[Any]:
        """Like `step`, for an effect that is a write to this database: `await fn(conn, *args,
        **kwargs)` runs in a transaction on a connection of the worker's (from a pool kept for
        steps, with the server's default session settings), the step is recorded in that same
        transaction, and both commit together or neither: a crash, an exception, a result that
        cannot be stored or a lost lease rolls the effect back with the checkpoint. `conn`
        refuses transaction control before sending it (COMMIT, ROLLBACK, BEGIN, SAVEPOINT, ...:
        a ValidationError, the step not recorded; `async with conn.transaction()` inside `fn`
        makes a savepoint). `fn` must not call `ctx.step`, `ctx.transactional_step` or
        `ctx.progress` (a PgWorkerError).

        From a plain `def` handler it blocks and returns the result, and a plain `fn(conn, ...)`
        runs in a thread with a synchronous `conn` (`execute`, `executemany`, `fetch`,
        `fetchrow`, `fetchval`, `with conn.transaction():` for a savepoint), each call run on the
        step's connection, with the same refusals; an `async def fn` gets the asynchronous one."""
        if threading.get_ident() == self._thread:
            return self._attempt_steps("transactional_step").transactional_step(
                name, fn, args, kwargs
            )
        if callable(fn) and not inspect.iscoroutinefunction(fn):
            fn = SyncStep(fn, self._blocking)
        return self._blocking(
            "transactional_step",
            lambda: self._attempt_steps("transactional_step").transactional_step(
                name, fn, args, kwargs
            ),
        )

    def wait_for_event(self, name: str, timeout: float | timedelta | None = None) -> Awaitable[Any]:
        """Wait, durably, for event `name` (`pgworker.emit`, SQL `emit()`, `POST /events/{name}`)
        and return its data. The k-th call of a handler run is the job's wait number k: when an
        event is there (delivered since, or emitted after the job was enqueued and not yet
        consumed by it), it returns at once; else the attempt ends with the outcome `waiting`
        (no retry spent, no slot held), the job stays `pending` until the event comes or
        `timeout` seconds pass, and the next attempt runs the handler again from the start:
        its steps return their stored results, and this wait returns the data. Past the
        timeout, it raises TimeoutError (the handler catches it or fails). The attempt ends by
        an exception that `except Exception` does not catch; `except BaseException` must
        re-raise it. A ValidationError for a bad name or timeout; PgWorkerError once the attempt
        lost its job. From a plain `def` handler it blocks and returns the data (or ends the
        attempt the same way). See docs/guide/events.md."""
        return self._call(  # type: ignore[no-any-return]
            "wait_for_event",
            lambda: self._attempt_steps("wait_for_event").wait_for_event(name, timeout),
        )

    def key(self, name: str) -> str:
        """A key for an effect outside this database, the same on every attempt of this job:
        pass it as the idempotency key of a remote API so that a repeated call is recognised."""
        return f"pgworker:{self._attempt.id}:{step_name(name)}"

    def progress(self, milestone: str, detail: dict[str, Any] | None = None) -> Awaitable[None]:
        """Report a milestone: `jobs.progress` becomes {"milestone", "detail", "at" (ISO 8601,
        UTC), "attempt"}, kept through later attempts and after the job ends, and
        `job_milestones` keeps every one. Fenced like a step. Awaited from `async def`
        handlers; from a plain `def` handler it blocks until the milestone is written."""
        return self._call(  # type: ignore[no-any-return]
            "progress", lambda: self._attempt_steps("progress").progress(milestone, detail)
        )

    @property
    def parents(self) -> dict[int, Job]:
        """The parents of a job enqueued with `after=`, by id, as read when this attempt
        started (their `result`, `status`, `error`); `{}` for a job without parents. A parent
        pruned since is missing from the dict. A plain property: plain `def` handlers read it
        too."""
        parents = self._attempt.parents
        return {} if parents is None else parents

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """The job's progress when this attempt started (the last milestone of an earlier
        attempt, or of this job before a replay), or None: where to resume from."""
        text = self._attempt.progress
        if text is None:
            return None
        value = json.loads(text)
        return value if isinstance(value, dict) else None

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, attempt={self.attempt}, type={self.type!r})"
