"""Durable steps and milestones (`ctx.step`, `ctx.transactional_step`, `ctx.progress`): what a
job has done, kept in PostgreSQL so that a later attempt resumes instead of doing it again.

Every write is fenced by the attempt (job id, attempt number, claim time), like its outcome: an
attempt that lost its job (lease expired and rescued, claimed again elsewhere) records nothing,
and its step raises so that its handler stops. The steps a job has done are read once per
attempt, at its first step; a handler that uses none costs nothing.

A step's reads and records are single statements on the worker's shared connection (see
_steps/store.py). A transactional step takes a connection of the steps' own pool for its
transaction only: it holds it while the user's function runs, which on the shared connection would
starve the heartbeat (and lose the lease), and the user's SQL must not run under the session
settings tuned for pgworker's own statements (generic plans, no bitmap scans, a lock timeout).

A transactional step's function cannot end the step's transaction: its connection refuses
transaction control before it is sent (`_steps.connection.StepConnection`), and the checkpoint is
written only if the step is still in the transaction it began in (its id, read when it began,
compared by the checkpoint's insert itself). The read costs one round trip per transactional step
(BEGIN, that read, the function's statements, the checkpoint, COMMIT: measured at about 40 µs on
a local server, where a whole step with one INSERT took 1-2 ms); it cannot ride on BEGIN, which
asyncpg's `Transaction` sends and which a nested `conn.transaction()` needs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import _threads
from .. import _validate as validate
from .._attempt import WaitingForEvent
from .._db.queries import AttemptKey
from .._payloads import json_text
from ..errors import PgWorkerError, ValidationError
from .connection import StepConnection
from .store import StepStore

if TYPE_CHECKING:
    from .._attempt import Attempt

MAX_NAME_LENGTH = 200
"""The longest step name or milestone, in characters."""

_inside: ContextVar[str | None] = ContextVar("pgworker_transactional_step", default=None)
"""The name of the transactional step whose function runs in this context, if any."""


def not_inside_a_transactional_step(what: str) -> None:
    """Steps and milestones are not for the function of a transactional step: they are written
    on another connection, outside the step's transaction, so they would not commit or roll back
    with its effect."""
    outer = _inside.get()
    if outer is not None:
        raise PgWorkerError(
            f"{what} called inside the function of transactional step {outer!r}: call it "
            "before or after that step (its function gets a connection and a transaction; "
            "write there what belongs with the step's effect)"
        )


def lost(attempt: Attempt, what: str) -> PgWorkerError:
    """The error that stops a handler whose attempt lost its job: its outcome would be dropped
    (fenced) anyway, and nothing it does now may be recorded."""
    return PgWorkerError(
        f"job {attempt.id}, attempt {attempt.number}: {what}: this attempt no longer holds the "
        "job (its lease expired and it was rescued, or it was claimed again); the handler stops "
        "here and the job's current attempt goes on"
    )


def step_name(value: Any) -> str:
    return validate.name("name", value, MAX_NAME_LENGTH)


def _json(field: str, value: Any, what: str) -> str:
    """`value` as compact JSON text storable in jsonb, or a ValidationError naming `field`."""
    return json_text(field, value, what, "nothing was stored")


async def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`fn(*args, **kwargs)`: awaited when async, in a thread when not (as plain `def` handlers
    run), its awaitable result awaited."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    value = await _threads.run(functools.partial(fn, *args, **kwargs))
    if inspect.isawaitable(value):
        value = await value
    return value


class Steps:
    """One attempt's steps: those its job had done (read at the first step) and those it did."""

    __slots__ = (
        "_attempt",
        "_done",
        "_key",
        "_loading",
        "_running",
        "_store",
        "_waiting",
        "_waits",
    )

    def __init__(self, attempt: Attempt) -> None:
        if attempt.store is None:
            raise PgWorkerError("steps and milestones need a worker: this attempt has none")
        self._attempt = attempt
        self._store: StepStore = attempt.store
        self._key: AttemptKey = (attempt.id, attempt.number, attempt.claimed_at)
        self._done: dict[str, str] | None = None
        self._loading = asyncio.Lock()
        self._running: dict[str, asyncio.Lock] = {}  # a lock per step name being run
        self._waits = 0  # the event waits this attempt reached
        self._waiting = asyncio.Lock()

    async def _steps_done(self, name: str) -> dict[str, str]:
        if self._done is None:
            async with self._loading:
                if self._done is None:
                    held, done = await self._store.q.job_steps_done(
                        await self._store.writes(), self._key
                    )
                    if not held:
                        raise lost(self._attempt, f"step {name!r} not run")
                    self._done = done
        return self._done

    async def _recorded(
        self, name: Any, fn: Callable[..., Any], what: str
    ) -> tuple[str, dict[str, str]]:
        """The step's checked name, and the steps this job has done (read once per attempt)."""
        name = step_name(name)
        _callable(fn)
        not_inside_a_transactional_step(f"{what} {name!r}")
        return name, await self._steps_done(name)

    async def _once(
        self, name: Any, fn: Callable[..., Any], what: str, run: Callable[[str], Awaitable[str]]
    ) -> Any:
        """The step's stored result; `run(name)` (which runs and records it, returning the
        stored JSON text) only when this job has not done it yet. Tasks of one handler calling
        the same step at once run it once: the others wait and get its result."""
        name, done = await self._recorded(name, fn, what)
        if name not in done:
            async with self._one_at_a_time(name):
                if name not in done:
                    done[name] = await run(name)
        return json.loads(done[name])

    async def step(
        self, name: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        async def run(name: str) -> str:
            started = datetime.now(UTC)
            value = await _call(fn, args, kwargs)
            text = _json("result", value, f"the result of step {name!r}")
            _, stored = await self._store.q.job_step_record(
                await self._store.writes(), self._key, name, text, started
            )
            if stored is None:
                raise lost(self._attempt, f"step {name!r} ran but was not recorded")
            return stored

        return await self._once(name, fn, "step", run)

    def _one_at_a_time(self, name: str) -> asyncio.Lock:
        """The lock of a step's name: tasks of one handler running the same step at once
        (asyncio.gather) run it once, the others getting its result."""
        lock = self._running.get(name)
        if lock is None:
            lock = self._running[name] = asyncio.Lock()
        return lock

    async def transactional_step(
        self, name: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        async def run(name: str) -> str:
            pool = await self._store.pool()
            async with pool.acquire() as conn, conn.transaction():
                began_in = await self._store.q.step_transaction(conn)
                guarded = StepConnection(conn, name, fn, pooler=self._store.pooler)
                inside = _inside.set(name)
                try:
                    pending = fn(guarded, *args, **kwargs)
                    if not inspect.isawaitable(pending):
                        raise ValidationError(
                            "fn",
                            f"step {name!r}: a transactional step's function must be async (it "
                            f"is awaited as fn(conn, ...)), got {fn!r}; nothing was stored",
                        )
                    value = await pending
                finally:
                    _inside.reset(inside)
                    guarded.detach()
                if guarded.refused is not None:  # the function caught it and went on
                    raise guarded.refused
                text = _json("result", value, f"the result of step {name!r}")
                # started_at None: now(), when this transaction began.
                own, stored = await self._store.q.job_step_record(
                    conn, self._key, name, text, None, began_in
                )
                if not own:
                    raise ValidationError(
                        "fn",
                        f"transactional step {name!r}: {fn!r} ended the step's transaction "
                        "itself (its transaction id changed: COMMIT or ROLLBACK by a path the "
                        "step's connection could not refuse), so its writes and the step cannot "
                        "commit together; the step is not recorded (for a savepoint, use `async "
                        "with conn.transaction()` inside the function)",
                    )
                if stored is None:
                    # Raised inside the transaction: the step's own writes roll back with it.
                    raise lost(self._attempt, f"step {name!r} rolled back")
            return stored

        return await self._once(name, fn, "transactional step", run)

    async def progress(self, milestone: Any, detail: Any) -> None:
        milestone = validate.name("milestone", milestone, MAX_NAME_LENGTH)
        not_inside_a_transactional_step(f"progress {milestone!r}")
        if detail is not None and not isinstance(detail, dict):
            raise ValidationError("detail", f"must be a dict or None, got {type(detail).__name__}")
        text = None if detail is None else _json("detail", detail, "the detail")
        if not await self._store.q.job_progress(
            await self._store.writes(), self._key, milestone, text
        ):
            raise lost(self._attempt, f"milestone {milestone!r} not recorded")

    async def wait_for_event(self, name: Any, timeout: Any) -> Any:  # noqa: ASYNC109 - durable
        """The data of event `name` for this job's next wait (see JobContext.wait_for_event):
        the k-th call of an attempt is the job's wait number k, whichever attempt reaches it."""
        name = validate.event_name(name)
        seconds = validate.timeout(timeout)
        not_inside_a_transactional_step(f"wait_for_event {name!r}")
        self._waits += 1
        seq = self._waits
        async with self._waiting:  # waits of one handler run in the order they were called
            pool = await self._store.pool()
            async with pool.acquire() as conn:
                row = await self._store.q.event_wait(conn, self._key, seq, name, seconds)
        if not row["held"]:
            raise lost(self._attempt, f"wait {seq} for event {name!r} not recorded")
        if row["name"] != name:
            raise PgWorkerError(
                f"wait {seq} of job {self._attempt.id} waited for event {row['name']!r}, and "
                f"this attempt now waits for {name!r} there: the handler must reach its waits "
                "in the same order on every attempt (put what varies in a step)"
            )
        if row["delivered"]:
            return None if row["data"] is None else json.loads(row["data"])
        if row["timed_out"]:
            raise TimeoutError(f"no event {name!r} came before the wait's deadline")
        delay = row["delay"]
        raise WaitingForEvent(name, math.inf if delay is None else max(delay, 0.0))


def _callable(fn: Any) -> None:
    if not callable(fn):
        raise ValidationError("fn", f"must be callable, got {fn!r}")
