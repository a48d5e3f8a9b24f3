"""Every error pgworker raises derives from PgWorkerError; handlers signal outcomes with
PermanentError, Retry and Snooze."""

from __future__ import annotations

from datetime import timedelta


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


class Retry(Exception):
    """Raised by a handler: run the job again `after` seconds from now (counts as a retry).

    `after` must be finite, >= 0 and at most `limits.MAX_DELAY` (ten years): anything else is a
    ValidationError when constructed, which inside a handler is the attempt's ordinary failure."""

    def __init__(self, after: float | timedelta = 0.0, reason: str | None = None) -> None:
        from ._limits import seconds  # _limits imports this module

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
        from ._limits import seconds  # _limits imports this module

        delay = seconds("after", after)
        super().__init__(f"snoozed for {delay:g}s")
        self.after = delay
