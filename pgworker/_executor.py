"""One attempt of one job: run its handler under the task's timeout and a cancel scope of its own,
and turn what happened into an AttemptResult. No SQL here: the completer writes the result."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import anyio

from ._limits import MAX_DEPTH, clamp_delay, clean_text, has_surrogates, json_problem
from ._logs import base_logger, enabled, get_logger
from ._redact import MESSAGE_LIMIT, Redactor, error_texts, redactor
from ._service import describe, error_parts
from ._steps import StepStore
from ._task import Task
from .context import JobContext, current_correlation_id
from .errors import PermanentError, Retry, Snooze
from .models import AttemptResult, Job, JobStatus, Outcome
from .retry import budget_spent, next_retry, why_final

_SCANNED_MESSAGE = 64 * 1024
"""An exception's message is read up to this length, then redacted, then summarised."""
STRAY_CANCELS = 10
"""How many times a job whose task was cancelled by something other than the worker is handed
back uncounted before such a cancellation counts as its failure."""
_TOO_DEEP = f"must not nest lists and objects more than {MAX_DEPTH} deep"


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
        "payload",
        "payload_error",
        "queue",
        "retry_count",
        "scope",
        "started",
        "stopped_as",
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
        self.task_cancelled = False
        self._log: Any = None

    @property
    def job(self) -> Job:
        """The job as the claim left it."""
        if self._job is None:
            self._job = Job.from_record(self._record, payload=self.payload)
        return self._job

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
        fields of AttemptResult (built positionally: one is made per job)."""
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

    def stop(self, outcome: Outcome) -> None:
        if self.stopped_as is None:
            self.stopped_as = outcome
        self.scope.cancel()


Error = tuple[str, str, str | None]
"""An attempt's error as stored: type, message (first line, redacted) and detail (the redacted
traceback, or None)."""


def _error(attempt: Attempt, exc: BaseException, redact: Redactor) -> Error:
    """The handler's exception as stored and logged: its message's first line and its traceback,
    with the payload's secrets and the patterns of `redact` replaced (_redact.py)."""
    error_type, message = error_parts(exc, _SCANNED_MESSAGE)
    summary, detail = error_texts(exc, redact, attempt.payload, message)
    return error_type, summary, detail


def _retry_or_fail(
    task: Task,
    attempt: Attempt,
    outcome: Outcome,
    error: Error,
    after: float | None = None,
    count_exhausted: bool = False,
) -> AttemptResult:
    """Back to pending, counted as a retry, when `next_retry` says so; else failed, the message
    ending with why when the time budget ended the retries (or the count, with
    `count_exhausted`). `outcome` is the attempt's when final (`failed` becomes `retried` when
    retried). The budget's time is read only for a policy that has one."""
    error_type, message, detail = error
    policy = task.retry
    elapsed = None if policy.max_elapsed is None else attempt.budget_elapsed()
    delay = next_retry(policy, attempt.retry_count, attempt.max_retries, after, elapsed)
    if delay is not None:
        return attempt.ends(
            JobStatus.PENDING,
            Outcome.RETRIED if outcome is Outcome.FAILED else outcome,
            error_type=error_type,
            error_message=message,
            delay=delay,
            retried=1,
            error_detail=detail,
        )
    if count_exhausted or budget_spent(policy, elapsed):
        why = why_final(policy, attempt.retry_count, attempt.max_retries)
        message = message[: MESSAGE_LIMIT - len(why)] + why
    return attempt.ends(
        JobStatus.FAILED,
        outcome,
        error_type=error_type,
        error_message=message,
        error_detail=detail,
    )


def _result_text(attempt: Attempt, value: Any) -> str | None:
    """The return value as jsonb text, or None with a warning when it cannot be stored (not
    JSON-serialisable, NUL characters, nested or sized past the limits). Lone surrogates are
    replaced by U+FFFD, as in error messages."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        _warn(attempt, "result not stored", error=f"the result {_TOO_DEEP}")
        return None
    except BaseException as exc:  # the value's own methods ran: anything may come out
        _warn(
            attempt,
            "result not stored: not JSON-serialisable",
            error=redactor().text(describe(exc), attempt.payload),
        )
        return None
    if has_surrogates(text):
        text = clean_text(text)
    problem = json_problem(text, value)
    if problem is not None:
        _warn(attempt, "result not stored", error=f"the result {problem}")
        return None
    return text


def _warn(attempt: Attempt, event: str, **fields: Any) -> None:
    """A warning about the attempt, which the handler's structlog context cannot prevent."""
    with contextlib.suppress(BaseException):
        attempt.log.warning(event, **fields)


def _completed(attempt: Attempt, value: Any) -> AttemptResult:
    return attempt.ends(
        JobStatus.COMPLETED,
        Outcome.COMPLETED,
        result=None if value is None else _result_text(attempt, value),
    )


class _DaemonThreads:
    """Threads for plain `def` handlers. Daemon threads, unlike anyio's: a handler that never
    returns is abandoned at shutdown (Python cannot stop a thread) and must not keep the process
    alive. Idle threads wait for the next handler."""

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                self._idle.append(inbox)

    async def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` in a thread, with the caller's context variables; raises what it raised. A
        cancelled caller stops waiting; the thread finishes on its own."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        context = contextvars.copy_context()

        def report(outcome: tuple[bool, Any]) -> None:
            if not done.done():
                done.set_result(outcome)

        def work() -> None:
            try:
                outcome = (True, context.run(fn))
            except BaseException as exc:
                outcome = (False, exc)
            if _forked:
                _leave_forked_child()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(report, outcome)

        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="pgworker-handler", daemon=True
            ).start()
        inbox.put(work)
        ok, value = await done
        if not ok:
            raise value
        return value


_threads = _DaemonThreads()


_forked = False
"""Set in a child process made by fork(); a worker starting there clears it (see `serving`). A
flag rather than os.getpid() around each handler: that is a system call per job."""


def _in_forked_child() -> None:
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_in_forked_child)


def serving() -> None:
    """A worker starts in this process: handlers that return here run in it, not in a child."""
    global _forked
    _forked = False


def _leave_forked_child() -> None:
    """A handler forked and its child came back here (returned, or raised: `sys.exit()`): the
    child must not go on as a second worker on the parent's connections."""
    os._exit(0)


def _task_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _cancelled_by_worker(attempt: Attempt) -> bool:
    """Whether a cancellation comes from the worker (this attempt's scope: timeout, cancel, lost
    lease, shutdown) rather than from the handler itself, which may await a task it cancelled or
    cancel its own: that one is the handler's failure. The worker cancels a running handler only
    through its attempt's scope (slots are tasks of their own, see producer.py)."""
    return attempt.scope.cancel_called


async def execute(
    attempt: Attempt, task: Task, worker_id: str, redact: Redactor | None = None
) -> AttemptResult:
    """Run one attempt to its outcome, in a structlog context bound to `attempt.keys` (the
    producer's slot binds them). Cancellation of this attempt's own scope (timeout, shutdown,
    operator cancel) is turned into an outcome; any other cancellation by the worker propagates.
    Whatever else the handler raises, BaseExceptions included (SystemExit, KeyboardInterrupt,
    GeneratorExit, its own CancelledError), is the attempt's failure. Its error texts are
    redacted with `redact` (the worker's `redact_keys`; None: the default words) before they are
    stored or logged."""
    current_correlation_id.set(attempt.correlation_id)
    ctx = JobContext(attempt, worker_id)
    log = base_logger()
    if enabled(log, logging.DEBUG):
        log.debug("job started", **attempt.keys, type=attempt.type, queue=attempt.queue)
    if task.timeout is not None:
        attempt.scope.deadline = min(attempt.scope.deadline, anyio.current_time() + task.timeout)
    started = attempt.started = time.monotonic()
    value: Any = None
    failure: BaseException | None = None
    if attempt.payload_error is not None:
        result = attempt.ends(
            JobStatus.FAILED,
            Outcome.FAILED,
            error_type="InvalidPayload",
            error_message=f"the payload cannot be decoded ({attempt.payload_error})",
        )
    else:
        with attempt.scope:
            try:
                if task.upgrade:  # an upgrader's failure is the attempt's, as a handler's is
                    attempt.upgrade(task)
                payload = attempt.payload
                if task.payload_type is not None:  # the handler's type; ctx.payload stays JSON
                    payload = task.payload_type.decode(payload)
                if task.is_async:
                    value = await task.fn(ctx, payload)
                else:
                    value = await _threads.run(functools.partial(task.fn, ctx, payload))
                    if inspect.isawaitable(value):
                        value = await value
            except BaseException as exc:
                if isinstance(exc, anyio.get_cancelled_exc_class()) and _cancelled_by_worker(
                    attempt
                ):
                    raise
                failure = exc
            finally:
                if _forked:
                    _leave_forked_child()
        result = _decide(attempt, task, value, failure, redact or redactor())
    try:  # noqa: SIM105 - contextlib.suppress would cost an object per job
        _log_outcome(log, attempt, result, started)
    except BaseException:
        pass  # the handler bound what cannot be rendered: its job is still done
    return result


def _log_outcome(log: Any, attempt: Attempt, result: AttemptResult, started: float) -> None:
    """One INFO line per attempt's end, failures included: a job's failure is the application's
    news, not pgworker's trouble, and an application that configured no logging sees none."""
    if enabled(log, logging.INFO):
        log.info(
            f"job {result.outcome.value}",
            **attempt.keys,
            type=attempt.type,
            status=result.status.value,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
            **(
                {"error": f"{result.error_type}: {result.error_message}"}
                if result.error_type
                else {}
            ),
            **(
                {"retry_in_s": round(result.delay, 3)} if result.status is JobStatus.PENDING else {}
            ),
        )


def _decide(
    attempt: Attempt, task: Task, value: Any, failure: BaseException | None, redact: Redactor
) -> AttemptResult:
    # Stopped by the worker: whatever the handler's cleanup raised on the way out (a `finally:`
    # that fails) does not make the stop its failure.
    if attempt.scope.cancelled_caught or (failure is not None and attempt.scope.cancel_called):
        if attempt.stopped_as is Outcome.INTERRUPTED:
            return attempt.ends(JobStatus.PENDING, Outcome.INTERRUPTED)
        if attempt.stopped_as is Outcome.LOST:
            return attempt.ends(JobStatus.PENDING, Outcome.LOST)
        if attempt.stopped_as is Outcome.CANCELLED:
            return attempt.ends(
                JobStatus.CANCELLED,
                Outcome.CANCELLED,
                error_type="Cancelled",
                error_message="cancelled by an operator",
            )
        timed_out = ("TimeoutError", f"timed out after {task.timeout:g}s", None)
        return _retry_or_fail(task, attempt, Outcome.TIMED_OUT, timed_out)
    if failure is None:
        return _completed(attempt, value)
    if isinstance(failure, asyncio.CancelledError) and _task_cancelled():
        # Something called cancel() on the task this handler ran in: the handler itself, or a
        # task an earlier job on the same slot left behind. Which, nobody can tell: the job is
        # handed back uncounted (the slot is replaced), up to STRAY_CANCELS times.
        attempt.task_cancelled = True
        if attempt.number - attempt.retry_count <= STRAY_CANCELS:
            return attempt.ends(
                JobStatus.PENDING,
                Outcome.INTERRUPTED,
                error_type="CancelledError",
                error_message="the task running this job was cancelled by something other than "
                "the worker (the handler, or a task an earlier handler left behind)",
            )
    if isinstance(failure, Snooze):
        # Not a failure: back to pending at the time asked, no retry spent, no error recorded.
        return attempt.ends(
            JobStatus.PENDING,
            Outcome.SNOOZED,
            delay=clamp_delay(_number(getattr(failure, "after", 0.0))),
        )
    error = _error(attempt, failure, redact)
    if isinstance(failure, PermanentError):
        return attempt.ends(
            JobStatus.FAILED,
            Outcome.FAILED,
            error_type=error[0],
            error_message=error[1],
            error_detail=error[2],
        )
    if isinstance(failure, Retry):
        return _retry_or_fail(
            task,
            attempt,
            Outcome.FAILED,
            error,
            clamp_delay(_number(getattr(failure, "after", 0.0))),
            count_exhausted=True,
        )
    if enabled(attempt.log, logging.DEBUG):
        with contextlib.suppress(BaseException):
            attempt.log.debug("handler raised", traceback=error[2])
    return _retry_or_fail(task, attempt, Outcome.FAILED, error)


def failed_by_worker(
    attempt: Attempt, task: Task, exc: BaseException, redact: Redactor | None = None
) -> AttemptResult:
    """The outcome of an attempt that pgworker itself failed to run to the end (a bug): an
    ordinary failure, retried while retries remain."""
    return _retry_or_fail(task, attempt, Outcome.FAILED, _error(attempt, exc, redact or redactor()))


def _number(value: Any) -> float:
    """A Retry's `after` as seconds, whatever a subclass put there (it is the handler's)."""
    try:
        return float(value.total_seconds() if hasattr(value, "total_seconds") else value)
    except Exception:
        return 0.0
