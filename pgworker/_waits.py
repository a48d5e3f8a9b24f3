"""Awaiting jobs: `wait(conn, job_id)` returns the job once it is completed,
failed or cancelled.

One waiter per process, event loop, database target and schema holds one connection of its own,
shared by every wait of the process: 200 jobs awaited at once cost one connection. That
connection LISTENs on the ended channel, then marks the jobs awaited (jobs_await_mark.sql), then
reads them (jobs_awaited.sql), in that order, so that no end is missed: a job that ends after
its mark commits is announced by migration 0018's trigger, one that ended before is read as
ended. Only awaited jobs are announced, so plain jobs pay nothing. A poll of every pending wait
(one statement every POLL_INTERVAL) stands in for a notification lost with a connection, or never
sent (a pooler between the waiter and PostgreSQL, where LISTEN hears nothing); a lost connection
is replaced after a backoff, its waits marked and read again. The connection is closed once no
wait has been left for IDLE_CLOSE seconds.

The waiter never runs a statement on the caller's connection: given a Connection, it opens its
own to the same server, database and user; the caller's transaction is left alone (a job
enqueued in a transaction not yet committed is unknown to the waiter: commit first)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from . import _validate as validate
from . import models
from ._db.connection import CONNECTION_ERRORS, connect
from ._db.queries import Row, queries
from ._logs import get_logger
from .errors import PgWorkerError, ValidationError
from .models import DEFAULT_SCHEMA, Job

POLL_INTERVAL = 2.0
"""Seconds between two polls of the pending waits: the worst-case latency of a wait whose
notification was lost."""
IDLE_CLOSE = 5.0
"""Seconds the waiter keeps its connection after its last wait ended."""
BACKOFF = (0.5, 5.0)
"""The first and the longest pause before a lost connection is replaced."""
APPLICATION_NAME = "pgworker-wait"
"""The waiter's connection is named `pgworker-wait:<pid>` in pg_stat_activity."""
FINAL = frozenset({"completed", "failed", "cancelled"})

Source = str | asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy
"""Where the jobs are: a DSN, an asyncpg Pool, or an asyncpg Connection (a pool's too)."""

# What a pool's connect arguments hold that is not about where and who to connect as.
_NOT_TARGET = frozenset(
    {
        "server_settings",
        "connection_class",
        "statement_cache_size",
        "record_class",
        "timeout",
        "command_timeout",
        "max_cached_statement_lifetime",
        "max_cacheable_statement_size",
    }
)

_log = get_logger()


def _target(source: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The connect arguments that reach the database of `source` as the same user."""
    if isinstance(source, str):
        return (source,), {}
    if isinstance(source, PoolConnectionProxy):
        holder = getattr(source, "_holder", None)
        pool = getattr(holder, "_pool", None)
        if pool is None:
            raise ValidationError("conn", "the connection was released to its pool: pass the pool")
        return _target(pool)
    if isinstance(source, asyncpg.Pool):
        # asyncpg keeps what the pool connects with in these (no public reader).
        given: dict[str, Any] = getattr(source, "_connect_kwargs", {})
        kwargs = {k: v for k, v in given.items() if k not in _NOT_TARGET}
        return tuple(getattr(source, "_connect_args", ())), kwargs
    if isinstance(source, asyncpg.Connection):
        # Where and as whom it connected (asyncpg's own cancel requests read these).
        addr: Any = getattr(source, "_addr")  # noqa: B009
        params: Any = getattr(source, "_params")  # noqa: B009
        if isinstance(addr, str):  # a Unix socket: its directory and the port in its name
            directory, _, name = addr.rpartition("/")
            host, port = directory, int(name.rpartition(".")[2])
        else:
            host, port = addr[0], addr[1]
        # The SSL context it was given (require and above), or the mode it tried (below).
        mode = getattr(params.sslmode, "name", None)
        ssl = mode if mode in ("disable", "allow", "prefer") else params.ssl
        return (), {
            "host": host,
            "port": port,
            "user": params.user,
            "password": params.password,
            "database": params.database,
            "ssl": ssl,
        }
    raise ValidationError(
        "conn",
        f"must be a DSN, an asyncpg Pool or an asyncpg Connection, got {type(source).__name__}",
    )


def _key(args: tuple[Any, ...], kwargs: dict[str, Any], schema: str) -> str:
    return repr((args, sorted((k, repr(v)) for k, v in kwargs.items()), schema))


class _Waiter:
    """The waits of one process (and event loop) on one database and schema, and the one
    connection that serves them all (see the module's docstring)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], schema: str) -> None:
        self._args = args
        self._kwargs = kwargs
        self._q = queries(schema)
        self._waits: dict[int, list[asyncio.Future[Job]]] = {}
        self._fresh: set[int] = set()
        """Waits to mark and read: new ones, or all of them after a reconnect."""
        self._known: set[int] = set()
        """Jobs read at least once: one found missing later was deleted while awaited."""
        self._ended: set[int] = set()
        """Jobs whose end was announced, to read."""
        self._unmarked: set[int] = set()
        """Jobs the mark skipped (their row locked by another transaction): marked again, and
        read, on every poll until marked."""
        self._first_read: dict[int, asyncio.Future[None]] = {}
        """Set once a job is read unfinished: what a wait timing out before that waits for."""
        self._kick = asyncio.Event()
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_poll = 0.0
        self.connections = 0
        """Connections opened so far."""

    async def wait(self, job_id: int, seconds: float | None) -> Job:
        future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._waits.setdefault(job_id, []).append(future)
        self._fresh.add(job_id)
        self._wake()
        try:
            try:
                async with asyncio.timeout(seconds):
                    # Shielded: the timeout cancels this task, not the wait's future.
                    return await asyncio.shield(future)
            except TimeoutError:
                if not future.done() and job_id not in self._known:
                    # Out of time before the job was read once (timeout=0 among them): the
                    # answer is that read, an ended job returned, an unknown id refused.
                    read = self._first_read.setdefault(
                        job_id, asyncio.get_running_loop().create_future()
                    )
                    either: list[asyncio.Future[Any]] = [future, read]
                    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if future.done() and not future.cancelled():
                    return future.result()  # answered as the time ran out
                raise
        finally:
            self._forget(job_id, future)

    async def close(self) -> None:
        """Stop serving: pending waits are cancelled, the connection closed."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for futures in self._waits.values():
            for future in futures:
                future.cancel()
        self._close()

    def _forget(self, job_id: int, future: asyncio.Future[Job]) -> None:
        futures = self._waits.get(job_id)
        if futures is not None and future in futures:
            futures.remove(future)
            if not futures:
                del self._waits[job_id]
                self._known.discard(job_id)
                self._unmarked.discard(job_id)
                self._read_once(job_id)
        if not self._waits:
            self._kick.set()  # the loop starts counting its idle time

    def _wake(self) -> None:
        self._kick.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="pgworker-wait")

    def _on_ended(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        try:
            job_id = validate.whole(payload)
        except ValueError:
            return  # anyone may NOTIFY the channel: what is not a job id is no end
        if job_id in self._waits:
            self._ended.add(job_id)
            self._kick.set()

    async def _run(self) -> None:
        """Serve the waits until none is left for IDLE_CLOSE seconds."""
        pause = BACKOFF[0]
        try:
            while True:
                if not self._waits:
                    self._kick.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(IDLE_CLOSE):
                            await self._kick.wait()
                    if not self._waits:
                        return
                    continue
                try:
                    await self._step()
                    pause = BACKOFF[0]
                except Exception as exc:
                    # A connection lost after it was opened is replaced, its waits marked and
                    # read again; one that cannot be opened (or a statement refused) fails the
                    # waits never read.
                    lost = self._conn is not None and isinstance(exc, CONNECTION_ERRORS)
                    self._close()
                    if not lost:
                        self._fail_unknown(exc)
                    _log.warning("waiter lost its connection; reconnecting", error=repr(exc))
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, BACKOFF[1])
        finally:
            self._close()

    def _fail_unknown(self, exc: Exception) -> None:
        """Waits that were never read get the error that stopped the waiter (a database that
        cannot be reached, a missing schema): they would otherwise wait without a job seen."""
        for job_id in [j for j in self._fresh if j not in self._known]:
            self._fresh.discard(job_id)
            self._settle(job_id, exc)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def _open(self) -> asyncpg.Connection:
        kwargs = {
            **self._kwargs,
            "statement_cache_size": 0,
            "server_settings": {"application_name": f"{APPLICATION_NAME}:{os.getpid()}"},
        }
        # A Connection's target is all keywords: an empty DSN adds nothing to them.
        conn = await connect(*(self._args or ("",)), **kwargs)
        self.connections += 1
        try:
            await conn.add_listener(self._q.ended_channel, self._on_ended)
            conn.add_termination_listener(lambda _c: self._kick.set())
        except BaseException:
            conn.terminate()
            raise
        # Ends announced while no connection listened are lost: mark and read every wait again.
        self._fresh |= self._waits.keys()
        self._next_poll = asyncio.get_running_loop().time() + POLL_INTERVAL
        return conn

    async def _step(self) -> None:
        """Mark and read the new waits, read the jobs announced ended (and, when due, every
        pending one), then wait for more or for the next poll."""
        self._kick.clear()
        if self._conn is None or self._conn.is_closed():
            self._close()
            self._conn = await self._open()
        conn = self._conn
        loop = asyncio.get_running_loop()
        poll = loop.time() >= self._next_poll
        fresh = (self._fresh | (self._unmarked if poll else set())) & self._waits.keys()
        reads = fresh | (self._ended & self._waits.keys())
        self._fresh, self._ended = set(), set()
        try:
            if fresh:
                skipped = await self._q.jobs_await_mark(conn, sorted(fresh))
                self._unmarked = (self._unmarked - fresh) | set(skipped)
            if poll:
                reads |= self._waits.keys()
                self._next_poll = loop.time() + POLL_INTERVAL
            if reads:
                self._read(await self._q.jobs_awaited(conn, sorted(reads)))
        except BaseException:
            self._fresh |= fresh  # read them again on the next connection
            raise
        if not (self._fresh or self._ended) and self._waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(self._next_poll - loop.time(), 0)):
                    await self._kick.wait()

    def _read(self, rows: Iterable[Row]) -> None:
        for row in rows:
            job_id = row["wanted"]
            if job_id not in self._waits:
                continue
            status = row["current"]
            if status is None:
                if job_id in self._known:
                    self._settle(
                        job_id,
                        PgWorkerError(
                            f"job {job_id} was deleted while awaited (pruned, or by hand): its "
                            "outcome is gone"
                        ),
                    )
                else:
                    self._settle(job_id, ValidationError("job_id", f"there is no job {job_id}"))
            elif status in FINAL:
                try:
                    self._settle(job_id, Job.from_record(row))
                except PgWorkerError as exc:
                    self._settle(job_id, exc)
            else:
                self._known.add(job_id)
                self._read_once(job_id)

    def _read_once(self, job_id: int) -> None:
        read = self._first_read.pop(job_id, None)
        if read is not None and not read.done():
            read.set_result(None)

    def _settle(self, job_id: int, outcome: Job | BaseException) -> None:
        for future in self._waits.pop(job_id, []):
            if future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        self._known.discard(job_id)
        self._unmarked.discard(job_id)
        self._read_once(job_id)


_waiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Waiter]] = (
    weakref.WeakKeyDictionary()
)


def waiter(source: Source, schema: str = DEFAULT_SCHEMA) -> _Waiter:
    """The waiter of this process and event loop for `source`'s database and `schema`."""
    args, kwargs = _target(source)
    found = _waiters.setdefault(asyncio.get_running_loop(), {})
    key = _key(args, kwargs, schema)
    if key not in found:
        found[key] = _Waiter(args, kwargs, schema)
    return found[key]


async def close() -> None:
    """Close the waiters of this event loop (a server shutting down): their waits are
    cancelled."""
    for found in list(_waiters.pop(asyncio.get_running_loop(), {}).values()):
        await found.close()


async def wait(
    conn: Source,
    job_id: int,
    timeout: float | timedelta | None = None,  # noqa: ASYNC109 (the promised signature)
    *,
    schema: str = DEFAULT_SCHEMA,
) -> Job:
    """The job `job_id` once it is completed, failed or cancelled (its `result` or `error`), as
    `get_job` reads it (without `steps`).

    `conn` is a DSN, an asyncpg Pool or an asyncpg Connection: no statement runs on it, and
    no connection of a pool is held while waiting; the process's one waiter connection (per
    database and schema) serves every wait. `timeout` (seconds or a timedelta; None: forever)
    raises the builtin TimeoutError when it runs out, and changes nothing about the job.
    Raises ValidationError (`job_id`) at once when there is no such job, and PgWorkerError when
    the job is deleted (pruned) while awaited."""
    found = validate.count("job_id", job_id, minimum=1, maximum=validate.MAX_BIGINT)
    seconds = None if timeout is None else validate.seconds("timeout", timeout)
    schema = validate.identifier("schema", schema)
    return await waiter(conn, schema).wait(found, seconds)


# EnqueueResult.wait calls `wait` through this hook: models sits below this module.
models.wait_hook = wait
