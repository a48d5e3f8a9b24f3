"""Every error pgworker raises derives from PgWorkerError; handlers signal outcomes with
PermanentError, Retry and Snooze.

The ground floor: this module imports nothing of pgworker, so the check of a number of seconds
that Retry and Snooze apply to their delay is defined here (`_limits` hands it on)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any


class PgWorkerError(Exception):
    """Root of pgworker's errors: catch this to catch them all."""


class ValidationError(PgWorkerError, ValueError):
    """An argument is invalid; nothing was written. `field` names the argument."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ConfigError(PgWorkerError, ValueError):
    """A setting or task option is invalid. `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class IdempotencyConflict(PgWorkerError):
    """The idempotency key already belongs to a job with another type or payload."""

    def __init__(self, key: str, job_id: int | None) -> None:
        owner = f"job {job_id}" if job_id is not None else "another job of the same batch"
        super().__init__(
            f"idempotency_key {key!r} already belongs to {owner} with a different type or "
            "payload; use a new key for different work"
        )
        self.key = key
        self.job_id = job_id


class JobNotPending(PgWorkerError):
    """The job is no longer pending (it runs, or it ended): `update_job` and an enqueue with
    `replace=True` change only a pending job, and changed nothing. `job_id` and `status` say
    which job and where it stands."""

    def __init__(self, message: str, job_id: int, status: str) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.status = status


class SchemaError(PgWorkerError):
    """The database schema is missing, older or newer than this code expects, or the server is
    older than pgworker supports (`migrate` says so before it writes anything)."""


class DatabaseUnavailable(PgWorkerError):
    """The database cannot be reached with the given DSN (or refuses more connections)."""


class PrivilegeError(PgWorkerError):
    """The database role lacks a privilege the worker needs; the message names it and the grant
    to run."""


class PermanentError(Exception):
    """Raised by a handler: the job fails at once, without retries."""


class InvalidPayload(PermanentError):
    """A stored payload that no longer fits its handler's payload type: the attempt fails at
    once, without retries (no retry makes it fit). Raised by the worker, not by handlers."""


class Retry(Exception):
    """Raised by a handler: run the job again `after` seconds from now (counts as a retry).

    `after` must be finite, >= 0 and at most `limits.MAX_DELAY` (ten years): anything else is a
    ValidationError when constructed, which inside a handler is the attempt's ordinary failure."""

    def __init__(self, after: float | timedelta = 0.0, reason: str | None = None) -> None:
        delay = seconds("after", after)
        super().__init__(reason or f"retry requested in {delay:g}s")
        self.after = delay


class Snooze(Exception):
    """Raised by a handler: run the job again `after` seconds from now *without* spending a retry
    (throttling: a rate limit, a resource not ready yet). The attempt is recorded with the
    outcome `snoozed`; the job's error is left as it was. Time snoozed counts against a
    `RetryPolicy(max_elapsed=)` budget, which only ends retries of failures.

    `after` must be finite, >= 0 and at most `limits.MAX_DELAY` (ten years): anything else is a
    ValidationError when constructed, which inside a handler is the attempt's ordinary failure."""

    def __init__(self, after: float | timedelta) -> None:
        delay = seconds("after", after)
        super().__init__(f"snoozed for {delay:g}s")
        self.after = delay


MAX_DELAY = 10 * 365 * 86400.0
"""Ten years, in seconds: the longest delay, `Retry(after=)`, backoff or timeout accepted; every
delay the worker computes is capped at it."""


def _span(number: float) -> str:
    for unit, size in (("year", 365 * 86400), ("day", 86400), ("hour", 3600)):
        if number >= size and number % size == 0:
            n = number / size
            return f"{number:,.0f} seconds ({n:g} {unit}{'s' if n != 1 else ''})"
    return f"{number:g} seconds"


def seconds(
    field: str,
    value: Any,
    *,
    maximum: float = MAX_DELAY,
    zero: bool = True,
    error: type[Exception] = ValidationError,
) -> float:
    """A finite number of seconds (or a timedelta) in [0, maximum] (or (0, maximum])."""
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise error(field, f"must be a number of seconds or a timedelta, got {value!r}")
    low = ">= 0" if zero else "> 0"
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        raise error(field, f"must be a finite number of seconds {low}, got {value!r}")
    if number > maximum:
        raise error(field, f"must be at most {_span(maximum)}, got {value!r}")
    return number
