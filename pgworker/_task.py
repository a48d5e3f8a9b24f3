"""A task's definition: a job type, its handler and its options. Data that the executor, the
enqueue path and the registry all read, so it sits below them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._validate import Rate
from .retry import RetryPolicy

if TYPE_CHECKING:
    from ._payloads import PayloadType

Handler = Callable[..., Any]
Upgrader = Callable[[Any], Any]
"""`fn(payload of version v) -> payload of version v + 1`, a plain function."""


def served_key(type: str, version: int) -> str:
    """How a served (type, version) is written in `workers.types`: the bare type for version 1
    (what workers wrote before versions existed), `type@N` otherwise. A type whose name holds an
    `@` is always written with its version (`a@b@1`), so the text after the last `@` is the
    version whenever there is one. The claim and `status_unserved.sql` build the same text."""
    if version == 1 and "@" not in type:
        return type
    return f"{type}@{version}"


@dataclass(frozen=True, slots=True)
class Task:
    """A job type and how to run it. `retry.max_retries` is the default a job gets when its
    enqueuer gave none."""

    name: str
    fn: Handler
    queue: str
    priority: int
    timeout: float | None
    retry: RetryPolicy
    is_async: bool
    version: int = 1
    """The payload version the handler takes (`jobs.version`)."""
    upgrade: Mapping[int, Upgrader] = field(default_factory=dict)
    """Upgraders by the version they read: `upgrade[v](payload)` is the payload at v + 1."""
    payload_type: PayloadType | None = None
    """The handler's payload type (a pydantic model, a dataclass or a TypedDict), or None: the
    payload is plain JSON."""
    max_running: int | None = None
    """At most this many jobs of the task running at once, fleet-wide (None: no limit)."""
    max_running_per_key: int | None = None
    """At most this many running at once per `concurrency_key`, keys served round-robin."""
    rate_limit: Rate | None = None
    """At most `starts` starts per `period` seconds, fleet-wide."""
    unique_states: tuple[str, ...] | None = None
    """The default `unique_states` of an enqueue with a `unique_key` (None: pending, running)."""
    unique_period: float | None = None
    """The default `unique_period` (seconds) of an enqueue with a `unique_key`."""

    @property
    def limited(self) -> bool:
        """Whether the task's claims go through the limits (job_claim_limited.sql)."""
        return (
            self.max_running is not None
            or self.max_running_per_key is not None
            or self.rate_limit is not None
        )

    @property
    def versions(self) -> range:
        """The payload versions this task runs: its own, and each older one from which the
        upgraders lead, step by step, to it."""
        oldest = self.version
        while oldest - 1 in self.upgrade:
            oldest -= 1
        return range(oldest, self.version + 1)

    def upgraded(self, payload: Any, version: int) -> Any:
        """`payload`, written at `version`, brought to the task's version by the upgraders
        v -> v+1 -> ... in turn. Whatever an upgrader raises is raised."""
        for v in range(version, self.version):
            payload = self.upgrade[v](payload)
        return payload
