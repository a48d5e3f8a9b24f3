"""The LISTEN connection: its own connection (a pool would drop LISTEN on reset), reconnecting with
jittered backoff. It wakes the producer when a job arrives in one of its queues and relays cancel
requests. A ping through its own channel every few seconds proves it still receives; one that
does not come back in time gets the connection replaced."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import asyncpg

from . import db
from .logs import get_logger

CHECK_EVERY = 5.0
CHECK_TIMEOUT = 5.0


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
        self,
        dsn: str,
        schema: str,
        queues: tuple[str, ...],
        wakeup: Wakeup,
        on_cancel: Callable[[int], None],
        worker_id: str,
    ) -> None:
        self._dsn = dsn
        self._schema = schema
        self._jobs_channel = db.channel(schema)
        self._cancel_channel = db.cancel_channel(schema)
        self._ping_channel = f"{schema}_ping_{uuid.uuid4().hex[:12]}"
        self._queues = frozenset(queues)
        self._wakeup = wakeup
        self._on_cancel = on_cancel
        self._worker_id = worker_id
        self._pong = anyio.Event()
        self._log = get_logger(worker_id=worker_id)
        self.reconnects = 0

    def _on_job(self, _conn: Any, _pid: int, _channel: str, queue: str) -> None:
        if queue in self._queues:
            self._wakeup.set()

    def _on_cancel_request(self, _conn: Any, _pid: int, _channel: str, job_id: str) -> None:
        if job_id.isdigit():
            self._on_cancel(int(job_id))

    def _on_ping(self, *_args: Any) -> None:
        self._pong.set()

    async def _listen(self) -> asyncpg.Connection:
        conn = await db.connect(
            self._dsn, server_settings={"application_name": f"pgworker-listen:{self._worker_id}"}
        )
        try:
            await conn.add_listener(self._jobs_channel, self._on_job)
            await conn.add_listener(self._cancel_channel, self._on_cancel_request)
            await conn.add_listener(self._ping_channel, self._on_ping)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def _healthy(self, conn: asyncpg.Connection) -> bool:
        self._pong = anyio.Event()
        with anyio.move_on_after(CHECK_TIMEOUT):
            await db.notify(conn, self._schema, self._ping_channel, "ping")
            await self._pong.wait()
        return self._pong.is_set()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; `task_status.started()` once the first LISTEN is in place."""
        failures = 0
        started = False
        while True:
            lost = anyio.Event()
            try:
                conn = await self._listen()
            except (*db.CONNECTION_ERRORS, db.DatabaseUnavailable) as exc:
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
                if started:
                    self.reconnects += 1
                    self._log.info("listener reconnected", after_failures=failures)
                failures = 0
                # Notifications sent while we were away are lost: look for work now.
                self._wakeup.set()
                if not started:
                    started = True
                    task_status.started()
                while not lost.is_set():
                    with anyio.move_on_after(CHECK_EVERY):
                        await lost.wait()
                    if not lost.is_set() and not await self._healthy(conn):
                        self._log.warning("listener stopped receiving; reconnecting")
                        break
                else:
                    self._log.warning("listener connection lost; reconnecting")
            except db.CONNECTION_ERRORS as exc:
                self._log.warning("listener connection lost; reconnecting", error=str(exc))
            finally:
                conn.terminate()
