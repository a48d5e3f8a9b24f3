"""The LISTEN connection: its own connection (a pool would drop LISTEN on reset), replaced after
the supervisor's backoff when lost. It wakes the producer when jobs arrive in one of its queues
and it is this worker's turn to claim them (turns.py), reads the list of workers that turns are
taken by, and relays cancel requests. A ping through its own channel every few seconds proves it
still receives; one that does not come back in time gets the connection replaced."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import asyncpg

from .. import _validate as validate
from .._db.connection import DSN_OPTIONS, connect
from .._db.queries import queries
from .._logs import get_logger
from ..errors import ConfigError
from .turns import Turns

CHECK_EVERY = 5.0
CHECK_TIMEOUT = 5.0
LISTEN_DSN_OPTIONS = "--listen-dsn or PGWORKER_LISTEN_DSN"
"""Where a listen DSN of its own comes from, for the messages about it."""


class Wakeup:
    """A level-triggered signal: `set` before `wait` is not lost; `clear` re-arms it."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    async def wait(self, seconds: float) -> bool:
        """Whether it was set (rather than `seconds` passed)."""
        with anyio.move_on_after(seconds):
            await self._event.wait()
        return self._event.is_set()


class Notifier:
    """A service (see service.py): each step connects when needed, then waits up to CHECK_EVERY
    for the connection to die and pings itself; a dead or deaf connection is dropped and the next
    step replaces it."""

    name = "notifier"

    def __init__(
        self,
        dsn: str,
        schema: str,
        turns: Turns,
        wakeup: Wakeup,
        on_cancel: Callable[[int], None],
        worker_id: str,
        *,
        where: str = DSN_OPTIONS,
    ) -> None:
        self._dsn = dsn
        self._where = where
        self.database: str | None = None
        """The database of the worker's jobs (the worker sets it before `connect`)."""
        self._schema = schema
        self._q = queries(schema)
        self._jobs_channel = self._q.jobs_channel
        self._cancel_channel = self._q.cancel_channel
        # Its own channel, unique to this connection: named after the schema, a long schema
        # name would make it longer than PostgreSQL's 63 bytes.
        self._ping_channel = f"pgworker_ping_{uuid.uuid4().hex}"
        self._turns = turns
        self._wakeup = wakeup
        self._on_cancel = on_cancel
        self._worker_id = worker_id
        self._pong = anyio.Event()
        self._lost = anyio.Event()
        self._conn: asyncpg.Connection | None = None
        self._log = get_logger(worker_id=worker_id)
        self.reconnects = 0
        self._next_check = 0.0

    def _on_job(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        if self._turns.mine(payload):
            self._wakeup.set()

    def _on_cancel_request(self, _conn: Any, _pid: int, _channel: str, job_id: object) -> None:
        try:
            found = validate.whole(job_id)
        except ValueError:
            return  # anyone may NOTIFY the channel: what is not a job id is no request
        self._on_cancel(found)

    def _on_ping(self, *_args: Any) -> None:
        self._pong.set()

    async def connect(self) -> None:
        """Open the LISTEN connection; the worker calls this at start-up, so that an unusable
        database is an error there, and each step calls it again after a loss."""
        conn = await connect(
            self._dsn,
            where=self._where,
            # Its few statements are not worth a cache, and none may linger on a pooler's
            # session before `_direct` has refused it.
            statement_cache_size=0,
            server_settings={"application_name": f"pgworker-listen:{self._worker_id}"},
        )
        try:
            await self._direct(conn)
            await conn.add_listener(self._jobs_channel, self._on_job)
            await conn.add_listener(self._cancel_channel, self._on_cancel_request)
            await conn.add_listener(self._ping_channel, self._on_ping)
            lost = self._lost = anyio.Event()
            conn.add_termination_listener(lambda _c: lost.set())
            # The other workers read the list of whose turn it is again.
            await self._q.notify(conn, self._jobs_channel, self._turns.hello)
        except BaseException:
            conn.terminate()
            raise
        self._conn = conn
        # Notifications sent while no connection listened are lost: look for work now.
        self._wakeup.set()

    async def _direct(self, conn: asyncpg.Connection) -> None:
        """Refuse a connection where LISTEN would hear nothing, silently: through a pooler (a
        transaction pooler gives the LISTEN session to other clients), or to another database
        than the worker's (NOTIFY stays within its database)."""
        pid, database = await self._q.session_identity(conn)
        if pid != conn.get_server_pid():
            raise ConfigError(
                "listen_dsn",
                f"the LISTEN connection ({self._where}) reaches PostgreSQL through a pooler such "
                "as PgBouncer, where LISTEN hears nothing: give --listen-dsn a URL that reaches "
                "PostgreSQL directly, or leave it out to poll every --poll-interval",
            )
        if self.database is not None and database != self.database:
            raise ConfigError(
                "listen_dsn",
                f"the LISTEN connection ({self._where}) reaches database {database!r}, the "
                f"worker's jobs are in {self.database!r}: NOTIFY reaches only the sessions of "
                "its own database, LISTEN there would hear nothing; give --listen-dsn the "
                "worker's database",
            )

    async def _healthy(self, conn: asyncpg.Connection) -> bool:
        self._pong = anyio.Event()
        with anyio.move_on_after(CHECK_TIMEOUT):
            await self._q.notify(conn, self._ping_channel, "ping")
            await self._pong.wait()
        return self._pong.is_set()

    def stopped(self) -> bool:
        return False

    async def idle(self) -> None:
        pass

    async def reset(self, exc: Exception) -> None:
        self.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def step(self) -> None:
        if self._conn is None:
            await self.connect()
            self.reconnects += 1
            self._log.info("listener reconnected")
            return
        with anyio.move_on_after(CHECK_TIMEOUT) as slow:
            for passed in self._turns.take():
                await self._q.jobs_pass(self._conn, *passed)
            if self._turns.due():
                await self._turns.refresh(self._conn)
        if slow.cancelled_caught:
            self._log.warning("listener stopped receiving; reconnecting")
            self.close()
            return
        with anyio.move_on_after(self._next_check - anyio.current_time()):
            await _either(self._lost, self._turns.nudged)
        if self._lost.is_set():
            # A failure like any other service's (a lost database is said once, by the worker's
            # service.Contact); `reset` closes the connection, the next step opens another.
            raise ConnectionError("the listener's connection was lost")
        if anyio.current_time() < self._next_check:
            return  # nudged: the next step passes turns on or reads the list
        self._next_check = anyio.current_time() + CHECK_EVERY
        if not await self._healthy(self._conn):
            self._log.warning("listener stopped receiving; reconnecting")
            self.close()


async def _either(first: anyio.Event, second: anyio.Event) -> None:
    """Wait until one of the two is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(wait, first)
        tg.start_soon(wait, second)
