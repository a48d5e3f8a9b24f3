"""One attempt of one job: run its handler under the task's timeout and a cancel scope of its own,
and turn what happened into an AttemptResult. No SQL here: the completer writes the result."""

from __future__ import annotations

import functools
import json
import logging
import math
from typing import Any

import anyio
import structlog

from .errors import PermanentError, Retry
from .logs import base_logger, enabled, get_logger
from .models import AttemptResult, Job, JobStatus, Outcome, current_correlation_id
from .registry import Task

_MESSAGE_LIMIT = 2000


class Attempt:
    """A running attempt as the worker sees it; `stop(outcome)` cancels just this job."""

    __slots__ = ("_log", "job", "keys", "scope", "stopped_as")

    def __init__(self, job: Job, worker_id: str) -> None:
        self.job = job
        self.keys = {
            "job_id": job.id,
            "attempt": job.attempts,
            "correlation_id": job.correlation_id,
            "worker_id": worker_id,
        }
        self.scope = anyio.CancelScope()
        self.stopped_as: Outcome | None = None
        self._log: Any = None

    @property
    def log(self) -> Any:
        """The logger bound to the job's keys, made when first needed."""
        if self._log is None:
            self._log = get_logger(**self.keys)
        return self._log

    def stop(self, outcome: Outcome) -> None:
        if self.stopped_as is None:
            self.stopped_as = outcome
        self.scope.cancel()


class JobContext:
    """What a handler knows about the attempt it runs. `log` is bound to the job's keys."""

    __slots__ = ("_attempt", "worker_id")

    def __init__(self, attempt: Attempt, worker_id: str) -> None:
        self._attempt = attempt
        self.worker_id = worker_id

    @property
    def job(self) -> Job:
        return self._attempt.job

    @property
    def job_id(self) -> int:
        return self._attempt.job.id

    @property
    def attempt(self) -> int:
        return self._attempt.job.attempts

    @property
    def correlation_id(self) -> str:
        return self._attempt.job.correlation_id

    @property
    def payload(self) -> Any:
        return self._attempt.job.payload

    @property
    def type(self) -> str:
        return self._attempt.job.type

    @property
    def queue(self) -> str:
        return self._attempt.job.queue

    @property
    def log(self) -> Any:
        return self._attempt.log

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, attempt={self.attempt}, type={self.type!r})"


def _error(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)[:_MESSAGE_LIMIT]


def _retry_or_fail(
    task: Task,
    job: Job,
    outcome: Outcome,
    error: tuple[str, str],
    delay: float,
    why_final: str = "",
) -> AttemptResult:
    """Back to pending after `delay` seconds, counted as a retry, while retries remain; else
    failed. `outcome` is the attempt's when final (`failed` becomes `retried` when retried)."""
    error_type, message = error
    retries = job.max_retries if job.max_retries is not None else task.retry.max_retries
    if job.retry_count < retries:
        return AttemptResult(
            job.id,
            job.attempts,
            JobStatus.PENDING,
            Outcome.RETRIED if outcome is Outcome.FAILED else outcome,
            error_type=error_type,
            error_message=message,
            delay=delay,
            retried=1,
        )
    return AttemptResult(
        job.id,
        job.attempts,
        JobStatus.FAILED,
        outcome,
        error_type=error_type,
        error_message=message + why_final.format(retries=retries),
    )


def _completed(job: Job, value: Any, attempt: Attempt) -> AttemptResult:
    result = None
    if value is not None:
        try:
            result = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            attempt.log.warning("result not stored: not JSON-serialisable", error=str(exc))
    return AttemptResult(
        job.id, job.attempts, JobStatus.COMPLETED, Outcome.COMPLETED, result=result
    )


async def execute(
    attempt: Attempt, task: Task, worker_id: str, limiter: anyio.CapacityLimiter
) -> AttemptResult:
    """Run one attempt to its outcome. Cancellation of this attempt's own scope (timeout,
    shutdown, operator cancel) is turned into an outcome; any other cancellation propagates."""
    job = attempt.job
    structlog.contextvars.bind_contextvars(**attempt.keys)
    current_correlation_id.set(job.correlation_id)
    ctx = JobContext(attempt, worker_id)
    log = base_logger()
    if enabled(log, logging.DEBUG):
        log.debug("job started", **attempt.keys, type=job.type, queue=job.queue)
    if task.timeout is not None:
        attempt.scope.deadline = min(attempt.scope.deadline, anyio.current_time() + task.timeout)
    started = anyio.current_time()
    value: Any = None
    failure: BaseException | None = None
    with attempt.scope:
        try:
            if task.is_async:
                value = await task.fn(ctx, job.payload)
            else:
                value = await anyio.to_thread.run_sync(
                    functools.partial(task.fn, ctx, job.payload),
                    abandon_on_cancel=True,
                    limiter=limiter,
                )
        except Exception as exc:
            failure = exc
    result = _decide(attempt, task, job, value, failure)
    failed = result.status is JobStatus.FAILED
    if enabled(log, logging.WARNING if failed else logging.INFO):
        (log.warning if failed else log.info)(
            f"job {result.outcome.value}",
            **attempt.keys,
            type=job.type,
            status=result.status.value,
            duration_ms=round((anyio.current_time() - started) * 1000, 1),
            **(
                {"error": f"{result.error_type}: {result.error_message}"}
                if result.error_type
                else {}
            ),
            **(
                {"retry_in_s": round(result.delay, 3)} if result.status is JobStatus.PENDING else {}
            ),
        )
    return result


def _decide(
    attempt: Attempt, task: Task, job: Job, value: Any, failure: BaseException | None
) -> AttemptResult:
    if attempt.scope.cancelled_caught:
        if attempt.stopped_as is Outcome.INTERRUPTED:
            return AttemptResult(job.id, job.attempts, JobStatus.PENDING, Outcome.INTERRUPTED)
        if attempt.stopped_as is Outcome.LOST:
            return AttemptResult(job.id, job.attempts, JobStatus.PENDING, Outcome.LOST)
        if attempt.stopped_as is Outcome.CANCELLED:
            return AttemptResult(
                job.id,
                job.attempts,
                JobStatus.CANCELLED,
                Outcome.CANCELLED,
                error_type="Cancelled",
                error_message="cancelled by an operator",
            )
        timed_out = ("TimeoutError", f"timed out after {task.timeout:g}s")
        return _retry_or_fail(
            task, job, Outcome.TIMED_OUT, timed_out, task.retry.delay(job.retry_count + 1)
        )
    if failure is None:
        return _completed(job, value, attempt)
    if isinstance(failure, PermanentError):
        error_type, message = _error(failure)
        return AttemptResult(
            job.id,
            job.attempts,
            JobStatus.FAILED,
            Outcome.FAILED,
            error_type=error_type,
            error_message=message,
        )
    if isinstance(failure, Retry):
        delay = failure.after if math.isfinite(failure.after) else 0.0
        return _retry_or_fail(
            task, job, Outcome.FAILED, _error(failure), delay, " (max_retries {retries} exhausted)"
        )
    attempt.log.debug("handler raised", exc_info=failure)
    return _retry_or_fail(
        task, job, Outcome.FAILED, _error(failure), task.retry.delay(job.retry_count + 1)
    )
