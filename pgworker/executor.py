"""One attempt of one job: run its handler under the task's timeout and a cancel scope of its own,
and turn what happened into an AttemptResult. No SQL here: the completer writes the result."""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from datetime import datetime
from typing import Any

import anyio

from .errors import PermanentError, Retry
from .logs import base_logger, enabled, get_logger
from .models import AttemptResult, Job, JobStatus, Outcome, claimed_job, current_correlation_id
from .registry import Task

_MESSAGE_LIMIT = 2000


class Attempt:
    """A running attempt as the worker sees it; `stop(outcome)` cancels just this job. It reads
    the few fields the worker needs from the claimed row; the full Job is built when first asked
    for, which most handlers never do."""

    __slots__ = (
        "_claim",
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
        "queue",
        "retry_count",
        "scope",
        "stopped_as",
        "type",
    )

    def __init__(self, record: Any, claim: tuple[datetime, str, datetime]) -> None:
        """`record` is a row of job_claim.sql; `claim` its time, the worker's id and the lease's
        end."""
        self._record = record
        self._claim = claim
        self._job: Job | None = None
        self.id: int = record["id"]
        self.number: int = record["attempts"]
        self.claimed_at: datetime = claim[0]
        self.type: str = record["type"]
        self.queue: str = record["queue"]
        self.payload: Any = json.loads(record["payload"])
        self.retry_count: int = record["retry_count"]
        self.max_retries: int | None = record["max_retries"]
        self.correlation_id: str = record["correlation_id"]
        self.keys = {
            "job_id": self.id,
            "attempt": self.number,
            "correlation_id": self.correlation_id,
            "worker_id": claim[1],
        }
        self.scope = anyio.CancelScope()
        self.stopped_as: Outcome | None = None
        self._log: Any = None

    @property
    def job(self) -> Job:
        """The job as the claim left it."""
        if self._job is None:
            claimed_at, worker_id, lease_expires_at = self._claim
            self._job = claimed_job(
                self._record, claimed_at, worker_id, lease_expires_at, self.payload
            )
        return self._job

    @property
    def log(self) -> Any:
        """The logger bound to the job's keys, made when first needed."""
        if self._log is None:
            self._log = get_logger(**self.keys)
        return self._log

    def ends(self, status: JobStatus, outcome: Outcome, **details: Any) -> AttemptResult:
        """This attempt's result: the job's next status, the attempt's outcome, and the other
        fields of AttemptResult by name."""
        return AttemptResult(self.id, self.number, self.claimed_at, status, outcome, **details)

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
        return self._attempt.id

    @property
    def attempt(self) -> int:
        return self._attempt.number

    @property
    def correlation_id(self) -> str:
        return self._attempt.correlation_id

    @property
    def payload(self) -> Any:
        return self._attempt.payload

    @property
    def type(self) -> str:
        return self._attempt.type

    @property
    def queue(self) -> str:
        return self._attempt.queue

    @property
    def log(self) -> Any:
        return self._attempt.log

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, attempt={self.attempt}, type={self.type!r})"


def _error(exc: BaseException) -> tuple[str, str]:
    """The error's type and message as stored; PostgreSQL text cannot hold NUL, so it is shown
    as `\\x00` rather than making the outcome unwritable."""
    return type(exc).__name__, str(exc)[:_MESSAGE_LIMIT].replace("\x00", "\\x00")


def _retry_or_fail(
    task: Task,
    attempt: Attempt,
    outcome: Outcome,
    error: tuple[str, str],
    delay: float,
    why_final: str = "",
) -> AttemptResult:
    """Back to pending after `delay` seconds, counted as a retry, while retries remain; else
    failed. `outcome` is the attempt's when final (`failed` becomes `retried` when retried)."""
    error_type, message = error
    retries = attempt.max_retries if attempt.max_retries is not None else task.retry.max_retries
    if attempt.retry_count < retries:
        return attempt.ends(
            JobStatus.PENDING,
            Outcome.RETRIED if outcome is Outcome.FAILED else outcome,
            error_type=error_type,
            error_message=message,
            delay=delay,
            retried=1,
        )
    return attempt.ends(
        JobStatus.FAILED,
        outcome,
        error_type=error_type,
        error_message=message + why_final.format(retries=retries),
    )


def _completed(attempt: Attempt, value: Any) -> AttemptResult:
    result = None
    if value is not None:
        try:
            result = json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            attempt.log.warning("result not stored: not JSON-serialisable", error=str(exc))
        if result is not None and "\\u0000" in result:
            attempt.log.warning("result not stored: jsonb cannot hold NUL characters")
            result = None
    return attempt.ends(
        JobStatus.COMPLETED,
        Outcome.COMPLETED,
        result=result,
    )


async def execute(
    attempt: Attempt, task: Task, worker_id: str, limiter: anyio.CapacityLimiter
) -> AttemptResult:
    """Run one attempt to its outcome, in a structlog context bound to `attempt.keys` (the
    producer's slot binds them). Cancellation of this attempt's own scope (timeout, shutdown,
    operator cancel) is turned into an outcome; any other cancellation propagates."""
    current_correlation_id.set(attempt.correlation_id)
    ctx = JobContext(attempt, worker_id)
    log = base_logger()
    if enabled(log, logging.DEBUG):
        log.debug("job started", **attempt.keys, type=attempt.type, queue=attempt.queue)
    if task.timeout is not None:
        attempt.scope.deadline = min(attempt.scope.deadline, anyio.current_time() + task.timeout)
    started = time.monotonic()
    value: Any = None
    failure: BaseException | None = None
    with attempt.scope:
        try:
            if task.is_async:
                value = await task.fn(ctx, attempt.payload)
            else:
                value = await anyio.to_thread.run_sync(
                    functools.partial(task.fn, ctx, attempt.payload),
                    abandon_on_cancel=True,
                    limiter=limiter,
                )
        except Exception as exc:
            failure = exc
    result = _decide(attempt, task, value, failure)
    failed = result.status is JobStatus.FAILED
    if enabled(log, logging.WARNING if failed else logging.INFO):
        (log.warning if failed else log.info)(
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
    return result


def _decide(
    attempt: Attempt, task: Task, value: Any, failure: BaseException | None
) -> AttemptResult:
    if attempt.scope.cancelled_caught:
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
        timed_out = ("TimeoutError", f"timed out after {task.timeout:g}s")
        return _retry_or_fail(
            task, attempt, Outcome.TIMED_OUT, timed_out, task.retry.delay(attempt.retry_count + 1)
        )
    if failure is None:
        return _completed(attempt, value)
    if isinstance(failure, PermanentError):
        error_type, message = _error(failure)
        return attempt.ends(
            JobStatus.FAILED,
            Outcome.FAILED,
            error_type=error_type,
            error_message=message,
        )
    if isinstance(failure, Retry):
        delay = failure.after if math.isfinite(failure.after) else 0.0
        return _retry_or_fail(
            task,
            attempt,
            Outcome.FAILED,
            _error(failure),
            delay,
            " (max_retries {retries} exhausted)",
        )
    attempt.log.debug("handler raised", exc_info=failure)
    return _retry_or_fail(
        task, attempt, Outcome.FAILED, _error(failure), task.retry.delay(attempt.retry_count + 1)
    )
