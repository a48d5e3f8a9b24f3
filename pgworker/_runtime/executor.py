"""One attempt of one job: run its handler under the task's timeout and a cancel scope of its own,
and turn what happened into an AttemptResult. No SQL here: the completer writes the result."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import time
from typing import Any

import anyio

from .. import _threads
from .._attempt import Attempt, WaitingForEvent, current_correlation_id
from .._logs import base_logger, enabled
from .._redact import MESSAGE_LIMIT, Redactor, describe, error_parts, error_texts, redactor
from .._task import Task
from .._validate import MAX_DEPTH, clamp_delay, clean_text, has_surrogates, json_problem
from ..context import JobContext
from ..errors import PermanentError, Retry, Snooze
from ..models import AttemptResult, JobStatus, Outcome
from ..retry import budget_spent, next_retry, why_final

_SCANNED_MESSAGE = 64 * 1024
"""An exception's message is read up to this length, then redacted, then summarised."""
STRAY_CANCELS = 10
"""How many times a job whose task was cancelled by something other than the worker is handed
back uncounted before such a cancellation counts as its failure."""
_TOO_DEEP = f"must not nest lists and objects more than {MAX_DEPTH} deep"


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
    attempt.started = time.monotonic()
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
                if attempt.parent_ids is not None:  # after=: ctx.parents, read once
                    await attempt.load_parents()
                if task.is_async:
                    value = await task.fn(ctx, _decoded(task, attempt.payload))
                else:  # its type's validators are as much its code: in its thread
                    ctx._threaded()
                    try:
                        value = await _threads.run(
                            functools.partial(_call, task, ctx, attempt.payload)
                        )
                    finally:  # returned, or left behind: its calls waiting on the loop end
                        ctx._release()
                    if inspect.isawaitable(value):
                        value = await value
            except BaseException as exc:
                if isinstance(exc, anyio.get_cancelled_exc_class()) and _cancelled_by_worker(
                    attempt
                ):
                    raise
                failure = exc
            finally:
                if _threads.forked:
                    _threads.leave_forked_child()
        result = _decide(attempt, task, value, failure, redact or redactor())
        if attempt.stopping is not None:  # read by the handler: its timeout's timer goes
            attempt.stopping.close(attempt.scope.cancel_called)
    try:  # noqa: SIM105 - contextlib.suppress would cost an object per job
        _log_outcome(log, attempt, result)
    except BaseException:
        pass  # the handler bound what cannot be rendered: its job is still done
    return result


def _decoded(task: Task, payload: Any) -> Any:
    """The payload as the handler takes it: its type's (ctx.payload stays JSON), or the JSON."""
    return payload if task.payload_type is None else task.payload_type.decode(payload)


def _call(task: Task, ctx: JobContext, payload: Any) -> Any:
    return task.fn(ctx, _decoded(task, payload))


def _log_outcome(log: Any, attempt: Attempt, result: AttemptResult) -> None:
    """One INFO line per attempt's end, failures included: a job's failure is the application's
    news, not pgworker's trouble, and an application that configured no logging sees none."""
    if enabled(log, logging.INFO):
        log.info(
            f"job {result.outcome.value}",
            **attempt.keys,
            type=attempt.type,
            status=result.status.value,
            run_ms=result.run_ms,
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
    if isinstance(failure, WaitingForEvent):
        # Not a failure: pending until the event comes (or the wait's deadline), no retry spent.
        return attempt.ends(JobStatus.PENDING, Outcome.WAITING, delay=failure.delay)
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
