"""One way to run a background service (claims, heartbeat, completer, listener, maintenance):
a step, a wait for the next one, and one place that decides what an exception means.

A failed step never ends the process: a lost connection, a statement the server cancelled or
timed out, too many connections or a lock not available are retried after the one jittered
backoff; anything unexpected is logged with its traceback and the service restarted after the
same backoff. Only the worker's own stop ends a service (cancellation is never caught here).
Each service exposes its health, which `Worker.health()` reports.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import anyio

from .._db.connection import classify
from .._redact import describe

State = Literal["ok", "retrying", "stopped"]

BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0


def backoff(failures: int) -> float:
    """Seconds to wait after the `failures`-th failure in a row: capped exponential, ±50%."""
    base: float = min(BACKOFF_BASE * 2.0 ** min(failures - 1, 16), BACKOFF_CAP)
    return base * random.uniform(0.5, 1.5)


class Health:
    """A service's health as `Worker.health()` reports it."""

    __slots__ = ("_last_success", "connections_lost", "consecutive_failures", "last_error", "state")

    def __init__(self) -> None:
        self.state: State = "ok"
        self.connections_lost = 0  # each means a new connection for the next step
        self._last_success: float | None = None
        self.consecutive_failures = 0
        self.last_error: str | None = None

    def succeeded(self) -> None:
        self.state = "ok"
        self._last_success = time.time()
        self.consecutive_failures = 0

    def failed(self, error: str) -> None:
        self.state = "retrying"
        self.consecutive_failures += 1
        self.last_error = error

    @property
    def last_success(self) -> datetime | None:
        """When a step last succeeded (kept as a number: steps run thousands of times a second)."""
        t = self._last_success
        return None if t is None else datetime.fromtimestamp(t, UTC)

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "last_success": self.last_success,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }


class Service(Protocol):
    """What `supervise` runs. `step` does one round of work and raises on failure; `idle` waits
    for the next round; `reset` forgets what the failure `exc` may have broken (a held
    connection, read-only sessions); `done` says the service has finished its work (the worker
    is stopping)."""

    name: str

    async def step(self) -> None: ...

    async def idle(self) -> None: ...

    async def reset(self, exc: Exception) -> None: ...

    def done(self) -> bool: ...


async def supervise(
    service: Service, health: Health, log: Any, stop: anyio.Event | None = None
) -> None:
    """Run `service` until it is done or cancelled, surviving every exception of its steps. A
    backoff ends early when `stop` is set."""
    try:
        while not service.done():
            try:
                await service.step()
                health.succeeded()
                if not service.done():
                    await service.idle()
            except Exception as exc:
                await _recover(service, health, log, exc, stop)
    finally:
        health.state = "stopped"


async def _recover(
    service: Service, health: Health, log: Any, exc: Exception, stop: anyio.Event | None
) -> None:
    """Record the failure, log it by its kind, reset the service and wait out the backoff."""
    kind = classify(exc)
    health.failed(describe(exc))
    if kind == "connection":
        health.connections_lost += 1
    delay = backoff(health.consecutive_failures)
    fields = {
        "service": service.name,
        "error": health.last_error,
        "kind": kind,
        "failures": health.consecutive_failures,
        "retry_in_s": round(delay, 2),
    }
    if kind == "unexpected":
        log.error(f"{service.name} failed unexpectedly; restarting it", exc_info=exc, **fields)
    else:
        log.warning(f"{service.name} failed; retrying", **fields)
    try:
        await service.reset(exc)
    except Exception as reset_exc:
        log.error(f"{service.name}: reset failed", exc_info=reset_exc)
    with anyio.move_on_after(delay):
        await (stop or anyio.Event()).wait()
