"""One way to run a background service (claims, heartbeat, completer, listener, each duty of
the maintenance): a step, a wait for the next one, and one place that decides what an exception
means.

A failed step never ends the process: a lost connection, a statement the server cancelled or
timed out, too many connections or a lock not available are retried after the one jittered
backoff; anything unexpected is logged with its traceback and the service restarted after the
same backoff. Only the worker's own stop ends a service (cancellation is never caught here).
Each service exposes its health, which `Worker.health()` reports.

A database that cannot be reached fails every service at once, again at each retry: the
services report those failures to the worker's one `Contact`, which says once that the database
is unreachable and once that it answers again (how long it was lost, how many retries), rather
than each service at each retry. asyncpg's pool, which logs each failed reconnection of its own
with a traceback, is heard at DEBUG while a worker runs in the process (`_QuietPool`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
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


class Contact:
    """Whether a worker (or `pgworker serve`'s maintenance) reaches its database, as its services
    find it. The first step that fails for the connection says so, once, at WARNING; the steps
    that fail likewise meanwhile are counted (each is retried) and the services log them at
    DEBUG. Contact is back when every service that failed so has since had a step succeed: one
    INFO line says how long it was lost and how many retries failed meanwhile."""

    def __init__(self, log: Any) -> None:
        self._log = log
        self._cut: set[Health] = set()
        """The services whose last step failed for the connection."""
        self._since = 0.0
        self._retries = 0
        self._heard: anyio.Event | None = None
        _listening.add(self)

    @property
    def lost(self) -> bool:
        return bool(self._cut)

    def failed(self, health: Health, service: str, error: str | None) -> None:
        """A step of `service` failed for the connection; it is retried after its backoff."""
        if not self._cut:
            self._since = time.monotonic()
            self._retries = 0
            self._log.warning(
                "database unreachable: retrying until it answers", service=service, error=error
            )
        self._retries += 1
        self._cut.add(health)

    def answered(self, health: Health) -> None:
        """A step of the service `health` belongs to succeeded."""
        if health not in self._cut:
            return
        self._cut.discard(health)
        if self._heard is not None:
            self._heard.set()
        if not self._cut:
            self._log.info(
                "database reachable again",
                unreachable_s=round(time.monotonic() - self._since, 1),
                retries=self._retries,
            )

    async def heard(self) -> None:
        """Return once a service that lost the database reaches it again: the others, waiting
        out their backoff, then try at once."""
        if self._heard is None or self._heard.is_set():
            self._heard = anyio.Event()
        await self._heard.wait()

    def close(self) -> None:
        """The worker stopped: its services report no more."""
        self._cut.clear()
        _listening.discard(self)


_listening: set[Contact] = set()
"""The contacts of the workers (and servers' maintenance) running in this process."""


class _QuietPool(logging.Filter):
    """asyncpg's pool keeps a connection open in the background (its floor) and logs each failed
    try at WARNING with a traceback. While a pgworker worker runs in the process, its Contact
    says once that the database is unreachable (its services fail too, a few milliseconds later
    or earlier): those records are DEBUG, dropped unless the `asyncpg.pool` logger shows DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _listening or record.levelno != logging.WARNING:
            return True
        if not str(record.msg).startswith("Failed to restore the pool connection floor"):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _quiet_pool() -> None:
    pool_log = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _QuietPool) for f in pool_log.filters):
        pool_log.addFilter(_QuietPool())


_quiet_pool()


class Health:
    """A service's health as `Worker.health()` reports it; `contact`, the worker's Contact, is
    told of the steps that fail for the connection and of those that succeed after."""

    __slots__ = (
        "_failed_at",
        "_last_success",
        "connections_lost",
        "consecutive_failures",
        "contact",
        "last_error",
        "state",
    )

    def __init__(self, contact: Contact | None = None) -> None:
        self.contact = contact
        self.state: State = "ok"
        self.connections_lost = 0  # each means a new connection for the next step
        self._last_success: float | None = None
        self._failed_at = 0.0
        self.consecutive_failures = 0
        self.last_error: str | None = None

    def succeeded(self) -> None:
        self.state = "ok"
        self._last_success = time.time()
        self.consecutive_failures = 0
        if self.contact is not None and self.contact.lost:
            self.contact.answered(self)

    def failed(self, error: str) -> None:
        self.state = "retrying"
        self.consecutive_failures += 1
        self.last_error = error
        self._failed_at = time.monotonic()

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


class Joint:
    """Several services' healths reported as one (`maintenance`: the leadership's renewal, the
    `main` one, and each duty it runs): retrying while any of them is, with the failures, error
    and last success of the one that failed most; otherwise ok, with the main one's last success
    (a duty of a worker that does not lead succeeds at doing nothing)."""

    def __init__(self, main: Health, others: Sequence[Health]) -> None:
        self.main = main
        self.parts = [main, *others]

    def _failing(self) -> Health | None:
        failing = [h for h in self.parts if h.state == "retrying"]
        return max(failing, key=lambda h: h.consecutive_failures) if failing else None

    @property
    def state(self) -> State:
        if all(h.state == "stopped" for h in self.parts):
            return "stopped"
        return "retrying" if self._failing() is not None else "ok"

    @property
    def connections_lost(self) -> int:
        return sum(h.connections_lost for h in self.parts)

    def as_dict(self) -> dict[str, Any]:
        worst = self._failing()
        if worst is not None:
            return worst.as_dict()
        last_failed = max(self.parts, key=lambda h: h._failed_at)
        return {
            "state": self.state,
            "last_success": self.main.last_success,
            "consecutive_failures": 0,
            "last_error": last_failed.last_error,
        }


class Service(Protocol):
    """What `supervise` runs. `step` does one round of work and raises on failure; `idle` waits
    for the next round; `reset` forgets what the failure `exc` may have broken (a held
    connection, read-only sessions); `stopped` says the service takes no more steps (the worker
    is stopping)."""

    name: str

    async def step(self) -> None: ...

    async def idle(self) -> None: ...

    async def reset(self, exc: Exception) -> None: ...

    def stopped(self) -> bool: ...


async def supervise(
    service: Service, health: Health, log: Any, stop: anyio.Event | None = None
) -> None:
    """Run `service` until it is done or cancelled, surviving every exception of its steps. A
    backoff ends early when `stop` is set."""
    try:
        while not service.stopped():
            try:
                await service.step()
                health.succeeded()
                if not service.stopped():
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
        if health.contact is not None:
            health.contact.failed(health, service.name, health.last_error)
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
    elif kind == "connection" and health.contact is not None:
        log.debug(f"{service.name} failed; retrying", **fields)  # the contact said it once
    else:
        log.warning(f"{service.name} failed; retrying", **fields)
    try:
        await service.reset(exc)
    except Exception as reset_exc:
        log.error(f"{service.name}: reset failed", exc_info=reset_exc)
    waits = [(stop or anyio.Event()).wait]
    if kind == "connection" and health.contact is not None:
        waits.append(health.contact.heard)  # back: retry now, not at the end of the backoff
    with anyio.move_on_after(delay):
        await _first(*waits)


async def _first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once the first of `waits` returns."""
    async with anyio.create_task_group() as tg:

        async def wait(until: Callable[[], Awaitable[object]]) -> None:
            await until()
            tg.cancel_scope.cancel()

        for until in waits:
            tg.start_soon(wait, until)
