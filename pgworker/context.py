"""What a handler sees of the attempt it runs, and the correlation id of the job running in the
current context (jobs enqueued from a handler inherit it)."""

from __future__ import annotations

from contextvars import ContextVar
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from .models import Job

if TYPE_CHECKING:
    from ._executor import Attempt

current_correlation_id: ContextVar[str | None] = ContextVar("pgworker_correlation_id", default=None)
"""The correlation id of the job running in this context, inherited by jobs it enqueues."""


def _forward(path: str) -> Any:
    """A read-only attribute of the context that reads the attempt's (one line per field, and
    as fast as a hand-written property)."""
    return property(attrgetter(path))


class JobContext:
    """What a handler knows about the attempt it runs. `log` is bound to the job's keys."""

    __slots__ = ("_attempt", "worker_id")

    def __init__(self, attempt: Attempt, worker_id: str) -> None:
        self._attempt = attempt
        self.worker_id = worker_id

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

    def __repr__(self) -> str:
        return f"JobContext(job_id={self.job_id}, attempt={self.attempt}, type={self.type!r})"
