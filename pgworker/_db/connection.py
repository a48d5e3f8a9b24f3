"""Connections: the pool and the connections hot loops hold, and what a database error means for
the service that met it (reconnect, back off, or handle the row alone)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .._redact import redact_dsn
from ..errors import DatabaseUnavailable, PrivilegeError, SchemaError
from ..models import DEFAULT_SCHEMA

Conn = asyncpg.Connection | PoolConnectionProxy
"""A connection of one's own, or one taken from a pool."""
Executor = Conn | asyncpg.Pool
"""Where a statement may run: a connection, or any connection of a pool."""

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    # asyncpg can report a connection killed mid-protocol this way.
    asyncpg.exceptions.InternalClientError,
)


# The server refused this statement or connection for now: retry after a backoff.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.QueryCanceledError,  # statement_timeout, pg_cancel_backend
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    asyncpg.exceptions.LockNotAvailableError,
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock
    asyncpg.exceptions.OperatorInterventionError,
    # The database is read-only for now (a standby, a failover under way): `recover` replaces
    # the sessions, which keep the read-only default they started with.
    asyncpg.exceptions.ReadOnlySQLTransactionError,
)

# The server (or asyncpg, encoding a parameter) refused these values: retrying cannot help, the
# row must be handled on its own.
REJECTED_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions._base.DataError,
    asyncpg.exceptions.IntegrityConstraintViolationError,
    asyncpg.exceptions.ProgramLimitExceededError,
    # A trigger of the user's own refusing the row (RAISE EXCEPTION, a failed ASSERT).
    asyncpg.exceptions.PLPGSQLError,
    asyncpg.exceptions.TriggeredActionError,
    UnicodeError,
    OverflowError,
)


_CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    *CONNECTION_ERRORS,
    asyncpg.PostgresError,
    ValueError,
)
"""What connecting raises when the DSN, the server or the login is wrong."""


def classify(exc: BaseException) -> str:
    """What a failed statement means for the service that sent it: "rejected" (the values),
    "connection" (reconnect), "transient" (back off, retry) or "unexpected"."""
    if isinstance(exc, REJECTED_ERRORS):
        return "rejected"
    if isinstance(exc, (*CONNECTION_ERRORS, DatabaseUnavailable)):
        return "connection"
    if isinstance(exc, TRANSIENT_ERRORS):
        return "transient"
    return "unexpected"


async def recover(pool: asyncpg.Pool, exc: BaseException) -> None:
    """After a failed statement: sessions that found the database read-only are replaced, since
    a session keeps the read-only default it started with."""
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        await pool.expire_connections()


def _describe(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """What went wrong, for a person: the server answered (no such database, login refused) or
    it did not (down, unreachable, a malformed DSN). Never the DSN's password: a malformed DSN
    may be quoted back by the driver."""
    return DatabaseUnavailable(redact_dsn(_connect_problem(exc), dsn))


def _connect_problem(exc: BaseException) -> str:
    where = "(--dsn, PGWORKER_DSN or DATABASE_URL)"
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        return str(too_many_connections(exc))
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return f"{exc}: create it, or fix the database name in the DSN {where}"
    if isinstance(
        exc,
        asyncpg.exceptions.InvalidAuthorizationSpecificationError
        | asyncpg.exceptions.InvalidPasswordError,
    ):
        fix = f"check the user and password in the DSN {where}"
        return f"the server refused the login ({exc}); {fix}"
    return (
        f"cannot reach the database ({type(exc).__name__}: {exc}); check the DSN "
        f"{where} and that PostgreSQL is running"
    )


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    kwargs.setdefault("timeout", 10)
    try:
        return await asyncpg.connect(dsn, **kwargs)
    except _CONNECT_ERRORS as exc:
        raise _describe(dsn, exc) from exc


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The worker's pooled connections never change session state (no LISTEN, no session locks,
    no SET), so releasing one needs no reset query: that would cost a round trip per statement."""


async def create_pool(
    dsn: str, size: int, application_name: str = "pgworker", lock_timeout: float | None = None
) -> asyncpg.Pool:
    """A pool for a worker; the server refusing more connections is DatabaseUnavailable."""
    try:
        return await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=size,
            timeout=10,
            reset=_keep_session,
            # The worker's statements are few, prepared once, and their plans do not depend on
            # the values: planning them again on each execution would double their cost. They
            # all reach a handful of rows by key, where a bitmap plan only ever loses: it would
            # AND in the partial index of running jobs, whose dead entries pile up between
            # vacuums, and read all of them on every outcome write.
            server_settings={
                "application_name": application_name,
                "plan_cache_mode": "force_generic_plan",
                "enable_bitmapscan": "off",
                **({"lock_timeout": str(int(lock_timeout * 1000))} if lock_timeout else {}),
            },
        )
    except _CONNECT_ERRORS as exc:
        raise _describe(dsn, exc) from exc


def _gone(conn: Conn) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.exceptions.InterfaceError:  # released back to the pool when it closed
        return True


class HeldConnection:
    """One pooled connection kept across statements by a hot loop (the claim, the outcome writes),
    sparing the pool's acquire and release per statement; replaced after a connection error."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: PoolConnectionProxy | None = None

    async def get(self) -> PoolConnectionProxy:
        if self._conn is not None and _gone(self._conn):
            # The server ended it and the pool took it back: a new one, without a failed try.
            self._conn = None
        if self._conn is None:
            self._conn = await self._pool.acquire()
        return self._conn

    async def discard(self) -> None:
        """Close the connection rather than give it back: it may be in the middle of a
        statement that was cancelled."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._pool.release(conn)

    def abandon(self) -> None:
        """Close the connection at once, whatever statement it waits on (a database that stopped
        answering: on a network that drops packets, it might wait for minutes after the network
        heals); the statement fails as on a lost connection, and the next `get` takes another."""
        if self._conn is not None and not _gone(self._conn):
            self._conn.terminate()

    async def drop(self) -> None:
        """Give the connection back (after an error, or when done); the next `get` takes another."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A connection that died was already handed back by the pool: nothing left to do.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._pool.release(conn)


def migrate_command(schema: str) -> str:
    """The command that creates or upgrades `schema`, for messages that say what to run."""
    return "pgworker migrate" if schema == DEFAULT_SCHEMA else f"pgworker migrate --schema {schema}"


@contextlib.contextmanager
def schema_errors(schema: str) -> Iterator[None]:
    """A missing schema or table becomes SchemaError, saying what to run."""
    try:
        yield
    except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError) as e:
        raise SchemaError(
            f"the pgworker schema {schema!r} is missing ({e}); run `{migrate_command(schema)}` "
            "first"
        ) from e


def privilege_error(schema: str, exc: BaseException) -> PrivilegeError:
    return PrivilegeError(
        f"the database role lacks a privilege on the pgworker schema {schema!r} ({exc}); grant "
        "USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on its tables"
    )


def too_many_connections(exc: BaseException) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the server refuses more connections ({exc}); a worker needs up to 5 (its pool of 4 "
        "and the listener): raise the role's CONNECTION LIMIT or max_connections, or run fewer "
        "processes"
    )
