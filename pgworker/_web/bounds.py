"""Every request's database work, bounded: one transaction per request, on a
connection taken from the pool under the same bound, each statement under a lock and statement
timeout, and the whole of it under REQUEST_TIMEOUT. A request the server gives up on is rolled
back (its connection, perhaps stuck in a statement, is terminated, never reused) and answered
503 with Retry-After: it is never applied later.

The timeouts are set with SET LOCAL inside the request's transaction (request_bounds.sql), not
as startup parameters nor session settings: a transaction pooler (PgBouncer in transaction mode)
refuses unknown startup parameters and does not keep a session's settings between transactions.
The overall bound is kept on this side (anyio), so that it also holds when the database, or the
network to it, stops answering altogether, where no server-side timeout can fire.

PostgreSQL stops statement_timeout before a COMMIT runs its deferred triggers: a slow one there
outlived the overall bound, serve answered 503 and closed its side of the connection, and the
backend went on and committed. Each request's transaction therefore also sets
client_connection_check_interval (CLIENT_CHECK), so that the backend rolls it back soon after
serve has closed the connection; on a server without that setting (client_check), it is
skipped."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .._db.connection import CONNECTION_ERRORS
from .._db.queries import Queries

REQUEST_TIMEOUT = 8.0
"""The most seconds one request of `serve` spends on the database, taking a connection from the
pool included; then it is rolled back and answered 503 (README, HTTP API)."""
STATEMENT_TIMEOUT = 5.0
"""statement_timeout of every statement of a request, well within REQUEST_TIMEOUT."""
LOCK_TIMEOUT = 4.0
"""lock_timeout of every statement of a request: the longest wait for one lock (a row another
session holds) before a 503. Each lock waited for starts it anew: STATEMENT_TIMEOUT bounds them
together."""
CLIENT_CHECK = 1.0
"""client_connection_check_interval of every request's transaction: the most seconds its backend
goes on after serve gave the request up and closed the connection."""
RETRY_AFTER = 2
"""Seconds a 503 asks the client to wait before it tries again (its Retry-After header)."""

GAVE_UP: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.QueryCanceledError,
)
"""What the database raises when a statement of a request reached its lock or statement timeout
(or was cancelled by an administrator)."""


class Unanswered(Exception):
    """The server gave a request up (a timeout): nothing of it was kept, unless `committing`
    (the database stopped answering during the COMMIT itself, whose fate the server cannot
    know). Answered 503 with Retry-After."""

    def __init__(self, message: str, committing: bool = False) -> None:
        super().__init__(message)
        self.committing = committing


async def client_check(pool: asyncpg.Pool, q: Queries) -> bool:
    """Whether the server takes client_connection_check_interval (PostgreSQL 14 or newer, on a
    system that can tell a closed connection: not Windows); asked once when serve starts, so
    that requests on a server without it still run. A database that does not answer then is
    taken to have none."""
    try:
        async with bounded(pool, q, client_check=False) as conn:
            await q.request_client_check(conn, CLIENT_CHECK)
    except (
        asyncpg.exceptions.UndefinedObjectError,  # 13 and older: no such setting
        asyncpg.exceptions.InvalidParameterValueError,  # a system where it can only be 0
        Unanswered,
    ):
        return False
    return True


@contextlib.asynccontextmanager
async def bounded(
    pool: asyncpg.Pool, q: Queries, seconds: float = REQUEST_TIMEOUT, *, client_check: bool
) -> AsyncIterator[PoolConnectionProxy]:
    """A connection in a transaction of its own, for one request: committed when the block ends,
    rolled back when it raises. Build the answer inside the block, so that it exists (and is
    known to be serialisable) before the write it reports commits. Raises Unanswered when the
    request takes more than `seconds`, or one of its statements waits on a lock or runs for
    more than STATEMENT_TIMEOUT. `client_check`: the server takes CLIENT_CHECK (client_check)."""
    conn: Any = None
    clean = False
    committing = False
    try:
        with anyio.move_on_after(seconds) as scope:
            conn = await pool.acquire()
            tx = conn.transaction()
            await tx.start()
            try:
                await q.request_bounds(
                    conn,
                    min(LOCK_TIMEOUT, seconds),
                    min(STATEMENT_TIMEOUT, seconds),
                    CLIENT_CHECK if client_check else None,
                )
                yield conn
            except BaseException:
                with contextlib.suppress(Exception):
                    await tx.rollback()
                    clean = True
                raise
            committing = True
            await tx.commit()
            clean = True
    except GAVE_UP as exc:
        why = (
            f"a row it needs stayed locked by another session for {LOCK_TIMEOUT:g} s"
            if isinstance(exc, asyncpg.exceptions.LockNotAvailableError)
            else f"a statement took more than {STATEMENT_TIMEOUT:g} s (waiting on rows locked by "
            "another session, or running slow), or was cancelled"
        )
        raise Unanswered(
            f"the request was given up: {why}; nothing was changed: try again"
        ) from None
    finally:
        if conn is not None:
            with anyio.CancelScope(shield=True), anyio.move_on_after(2):
                if not clean:
                    conn.terminate()
                with contextlib.suppress(*CONNECTION_ERRORS):
                    await pool.release(conn)
    if scope.cancelled_caught:
        if committing:
            raise Unanswered(
                f"the database did not confirm the commit within {seconds:g} s: the request may "
                "or may not have been applied; read it back before you repeat a write without "
                "an idempotency key",
                committing=True,
            )
        raise Unanswered(
            f"the database did not answer within {seconds:g} s; nothing was changed: try again"
        )
