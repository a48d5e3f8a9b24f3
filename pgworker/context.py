"""What a handler sees of the attempt it runs, and the correlation id of the job running in the
current context (jobs enqueued from a handler inherit it)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .models import Job

if TYPE_CHECKING:
    from ._executor import Attempt

current_correlation_id: ContextVar[str | None] = ContextVar("pgworker_correlation_id", default=None)
"""The correlation id of the job running in this context, inherited by jobs it enqueues."""


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
