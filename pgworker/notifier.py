"""The LISTEN connection: its own connection (a pool would drop LISTEN on reset), reconnecting with
jittered backoff, waking the producer when a job arrives in one of its queues."""

from __future__ import annotations

import random
from typing import Any

import anyio

from . import db
from .logs import get_logger


class Wakeup:
    """A level-triggered signal: `set` before `wait` is not lost; `clear` re-arms it."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._event.wait()


class Notifier:
    def __init__(
        self, dsn: str, schema: str, queues: tuple[str, ...], wakeup: Wakeup, worker_id: str
    ) -> None:
        self._dsn = dsn
        self._channel = f"{schema}_jobs"
        self._queues = frozenset(queues)
        self._wakeup = wakeup
        self._log = get_logger(worker_id=worker_id)

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, queue: str) -> None:
        if queue in self._queues:
            self._wakeup.set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; `task_status.started()` once the first LISTEN is in place."""
        failures = 0
        started = False
        while True:
            lost = anyio.Event()
            try:
                conn = await db.connect(self._dsn)
            except db.DatabaseUnavailable as exc:
                if not started:
                    raise
                failures += 1
                delay = min(0.1 * 2**failures, 5.0) * random.uniform(0.5, 1.5)
                self._log.warning(
                    "listener reconnect failed", error=str(exc), retry_in_s=round(delay, 2)
                )
                await anyio.sleep(delay)
                continue
            try:
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(self._channel, self._on_notify)
                if started:
                    self._log.info("listener reconnected", after_failures=failures)
                failures = 0
                # Notifications sent while we were away are lost: look for work now.
                self._wakeup.set()
                if not started:
                    started = True
                    task_status.started()
                await lost.wait()
                self._log.warning("listener connection lost; reconnecting")
            except db.CONNECTION_ERRORS as exc:
                self._log.warning("listener connection lost; reconnecting", error=str(exc))
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                    if not conn.is_closed():
                        await conn.close()
