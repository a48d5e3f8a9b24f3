"""What a handler sees of the attempt it runs, and the correlation id of the job running in the
current context (jobs enqueued from a handler inherit it)."""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ._attempt import current_correlation_id as current_correlation_id
from ._steps import Steps, step_name
from .errors import PgWorkerError
from .models import Job

if TYPE_CHECKING:
    from ._attempt import Attempt


def _forward(path: str) -> Any:
    """A read-only attribute of the context that reads the attempt's (one line per field, and
    as fast as a hand-written property)."""
    return property(attrgetter(path))


class JobContext:
    """What a handler knows about the attempt it runs, and what it keeps across attempts: its
    durable steps and milestones. `log` is bound to the job's keys."""

    __slots__ = ("_attempt", "_steps", "_thread", "worker_id")

    def __init__(self, attempt: Attempt, worker_id: str) -> None:
        self._attempt = attempt
        self.worker_id = worker_id
        self._steps: Steps | None = None  # made at the first step or milestone
        self._thread = threading.get_ident()  # the event loop's

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

    def _attempt_steps(self, what: str) -> Steps:
        """The attempt's steps, for `await ctx.<what>(...)` on the worker's event loop. From a
        plain `def` handler (a thread) the call is an error at once: its coroutine, never
        awaited, would do nothing, silently."""
        if threading.get_ident() != self._thread:
            raise PgWorkerError(
                f"ctx.{what} is a coroutine for `async def` handlers, awaited on the worker's "
                "event loop; this handler runs in a thread (a plain `def`): make it `async def`"
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
        propagate). Steps are awaited, so they are for `async def` handlers: called from a plain
        `def` handler, it raises PgWorkerError at once. Tasks of one handler running the same
        step at once run it once."""
        return self._attempt_steps("step").step(name, fn, args, kwargs)

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
        `ctx.progress` (a PgWorkerError)."""
        return self._attempt_steps("transactional_step").transactional_step(name, fn, args, kwargs)

    def key(self, name: str) -> str:
        """A key for an effect outside this database, the same on every attempt of this job:
        pass it as the idempotency key of a remote API so that a repeated call is recognised."""
        return f"pgworker:{self._attempt.id}:{step_name(name)}"

    def progress(self, milestone: str, detail: dict[str, Any] | None = None) -> Awaitable[None]:
        """Report a milestone: `jobs.progress` becomes {"milestone", "detail", "at" (ISO 8601,
        UTC), "attempt"}, kept through later attempts and after the job ends, and
        `job_milestones` keeps every one. Fenced like a step."""
        return self._attempt_steps("progress").progress(milestone, detail)

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
