"""Connections: the pool and the connections hot loops hold, and what a database error means for
the service that met it (reconnect, back off, or handle the row alone)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .._redact import redact_dsn
from ..errors import ConfigError, DatabaseUnavailable, PgWorkerError, PrivilegeError, SchemaError
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


async def recover(pool: asyncpg.Pool | SharedConnection, exc: BaseException) -> None:
    """After a failed statement: sessions that found the database read-only are replaced, since
    a session keeps the read-only default it started with."""
    if isinstance(exc, asyncpg.exceptions.ReadOnlySQLTransactionError):
        await pool.expire_connections()


POOLER_OPTION = "--pooler (PGWORKER_POOLER=true; pooler=True in Python)"
"""How pooler mode is turned on, for the messages that ask for it."""


def pooler_refusal(exc: BaseException) -> ConfigError | None:
    """The error that says to turn pooler mode on, when `exc` is what a transaction pooler
    (PgBouncer in transaction mode) does to a client that keeps session state: it refuses the
    startup parameters, or hands the session's prepared statements to another client."""
    if isinstance(exc, asyncpg.exceptions.ProtocolViolationError) and (
        "startup parameter" in str(exc)
    ):
        seen = str(exc)
    elif isinstance(
        exc,
        asyncpg.exceptions.DuplicatePreparedStatementError
        | asyncpg.exceptions.InvalidSQLStatementNameError,
    ):
        # asyncpg appends a long hint about PgBouncer: the first line says what happened.
        seen = f"{type(exc).__name__}: {str(exc).partition(chr(10))[0]}"
    else:
        return None
    return pooler_needed(seen)


def pooler_needed(seen: str) -> ConfigError:
    return ConfigError(
        "pooler",
        f"the database is reached through a transaction pooler such as PgBouncer ({seen}); "
        f"turn pooler mode on: {POOLER_OPTION}",
    )


DSN_OPTIONS = "--dsn, PGWORKER_DSN or DATABASE_URL"
"""Where the DSN comes from, for the messages about it."""


def _describe(dsn: str, exc: BaseException, where: str = DSN_OPTIONS) -> PgWorkerError:
    """What went wrong, for a person: the server answered (no such database, login refused) or
    it did not (down, unreachable, a malformed DSN), or a transaction pooler refused what only a
    session keeps. Never the DSN's password: a malformed DSN may be quoted back by the
    driver."""
    pooler = pooler_refusal(exc)
    if pooler is not None:
        return pooler
    return DatabaseUnavailable(redact_dsn(_connect_problem(dsn, exc, f"({where})"), dsn))


def _cut_userinfo(dsn: str) -> bool:
    """Whether the user or password part of a URL DSN holds a character that ends that part
    (/ ? #): the driver then reads a piece of the password as the host, port or options, and
    quotes it back in its error, where no redaction can find it whole."""
    _, scheme, rest = dsn.partition("://")
    userinfo = rest.rpartition("@")[0] if scheme else ""
    return any(c in userinfo for c in "/?#")


def _connect_problem(dsn: str, exc: BaseException, where: str) -> str:
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
    if isinstance(exc, ValueError) and _cut_userinfo(dsn):
        return (
            f"the DSN {where} is not a valid URL: its user or password holds / ? or #, which "
            "end that part of a URL; percent-encode them (%2F, %3F, %23; @ is %40, : is %3A)"
        )
    return (
        f"cannot reach the database ({type(exc).__name__}: {exc}); check the DSN "
        f"{where} and that PostgreSQL is running"
    )


async def connect(
    dsn: str, *, pooler: bool = False, where: str = DSN_OPTIONS, **kwargs: Any
) -> asyncpg.Connection:
    """A connection of one's own; with `pooler`, one that keeps no prepared statement (see
    `create_pool`). `where` names the options the DSN comes from, in the errors."""
    kwargs.setdefault("timeout", 10)
    if pooler:
        kwargs["statement_cache_size"] = 0
    try:
        return await asyncpg.connect(dsn, **kwargs)
    except _CONNECT_ERRORS as exc:
        raise _describe(dsn, exc, where) from exc


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The worker's pooled connections never change session state (no LISTEN, no session locks,
    no SET), so releasing one needs no reset query: that would cost a round trip per statement."""


_BEGIN = re.compile(r"\s*(BEGIN|START\s+TRANSACTION)\b[^;]*;?\s*", re.IGNORECASE)
"""A statement that only opens a transaction (asyncpg's `transaction()` sends `BEGIN ...;`)."""


class PoolerConnection(asyncpg.Connection):
    """A pooled connection through a transaction pooler, which starts each transaction on any
    server session: what a direct pool sets once per session as startup parameters is set here
    in each transaction, with SET LOCAL (`settings`). A transaction opened by `transaction()` or
    a plain BEGIN gets them with its BEGIN, in the same round trip. A statement sent outside a
    transaction gets a transaction of its own that begins with them: one round trip more for
    BEGIN and the settings (sent together), one for COMMIT. Other statements without arguments
    (COMMIT, a migration's text) pass as they are."""

    settings = ""
    lock_timeout: str | None = None
    """The transaction's lock_timeout in ms, as text, that `call_pooled` passes on."""
    through_pooler = True
    """What `through_pooler` reads, through a pool's proxy too."""

    async def call_pooled(self, call: str, *args: Any) -> Any:
        """The rows of a pooled function (see `Queries.pooled_functions`), whose plan its server
        session keeps. It sets what the transaction needs itself (its SET clauses, and the lock
        timeout passed as its last argument): outside a transaction it goes alone, without BEGIN
        and COMMIT."""
        return await super().fetch(call, *args, self.lock_timeout)

    async def _settled(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        if self.is_in_transaction():
            return await call(*args, **kwargs)
        await super().execute(_joined("BEGIN", self.settings))
        try:
            result = await call(*args, **kwargs)
        except Exception:
            # After a cancellation the pool's reset (or the held connection's discard) ends it.
            with contextlib.suppress(Exception):
                await super().execute("ROLLBACK")
            raise
        await super().execute("COMMIT")
        return result

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        if not args:
            if self.settings and not self.is_in_transaction() and _BEGIN.fullmatch(query):
                query = _joined(query, self.settings)
            return await super().execute(query, **kwargs)
        return await self._settled(super().execute, query, *args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._settled(super().fetch, query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._settled(super().fetchrow, query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return await self._settled(super().fetchval, query, *args, **kwargs)


def _joined(begin: str, settings: str) -> str:
    return f"{begin.strip().rstrip(';')}; {settings}" if settings else begin


def through_pooler(conn: Any) -> bool:
    """Whether `conn` (a connection, or a pool's proxy of one) is a pooler mode connection,
    which must not keep a named statement or a portal past its transaction."""
    return getattr(conn, "through_pooler", False) is True


def _pooler_settings(lock_timeout: float | None) -> str:
    """The settings of a direct pool's sessions that still matter through a pooler.

    Not set: plan_cache_mode (no statement is prepared twice: each is planned with its values
    at each execution either way) and application_name (the server session is anyone's; and a
    pooler that tracks it would send a SET whenever a client with another name gets a server
    session)."""
    settings = ["SET LOCAL enable_bitmapscan = off"]
    if lock_timeout:
        settings.append(f"SET LOCAL lock_timeout = {_milliseconds(lock_timeout)}")
    return "; ".join(settings)


def _milliseconds(seconds: float) -> str:
    return str(int(seconds * 1000))


async def create_pool(
    dsn: str,
    size: int,
    application_name: str = "pgworker",
    lock_timeout: float | None = None,
    *,
    pooler: bool = False,
    keyed: bool = False,
) -> asyncpg.Pool:
    """A pool for a worker; the server refusing more connections is DatabaseUnavailable. A
    `keyed` pool runs only statements that reach their rows through an index (the worker's):
    its plans never scan a table whole, even when planned while the table was empty. With
    `pooler` (a transaction pooler in front of the server), no startup parameters and no
    prepared statement kept: asyncpg's statement cache is off, so each statement is sent
    unnamed, parsed and bound in one go, and planned with its values (so `keyed` has nothing to
    guard against); the settings go into each transaction (`PoolerConnection`)."""
    mode: dict[str, Any]
    if pooler:
        per_transaction = _pooler_settings(lock_timeout)
        timeout = _milliseconds(lock_timeout) if lock_timeout else None

        async def init(conn: asyncpg.Connection) -> None:
            cast(PoolerConnection, conn).settings = per_transaction
            cast(PoolerConnection, conn).lock_timeout = timeout

        mode = {"statement_cache_size": 0, "connection_class": PoolerConnection, "init": init}
    else:
        # The worker's statements are few, prepared once, and their plans do not depend on the
        # values: planning them again on each execution would double their cost. They all reach
        # a handful of rows by key, where a bitmap plan only ever loses: it would AND in the
        # partial index of running jobs, whose dead entries pile up between vacuums, and read
        # all of them on every outcome write.
        settings = {
            "application_name": application_name,
            "plan_cache_mode": "force_generic_plan",
            "enable_bitmapscan": "off",
        }
        if keyed:
            # A generic plan made while `jobs` is empty (a new or truncated table) would scan it
            # whole, and stay cached once it fills: one plan per connection, for minutes. A
            # generic plan's costs assume 10% of a table where a limit is a parameter, enough to
            # compile it on every run (0.35 s a claim) where JIT is on.
            settings |= {"enable_seqscan": "off", "jit": "off"}
        if lock_timeout:
            settings["lock_timeout"] = _milliseconds(lock_timeout)
        mode = {"server_settings": settings}
    try:
        return await asyncpg.create_pool(
            dsn, min_size=1, max_size=size, timeout=10, reset=_keep_session, **mode
        )
    except _CONNECT_ERRORS as exc:
        raise _describe(dsn, exc) from exc


def _gone(conn: Conn) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.exceptions.InterfaceError:  # released back to the pool when it closed
        return True


CANCEL_TIMEOUT = 5.0
"""The longest a cancel request of an abandoned statement may take to send."""

_cancels: set[asyncio.Task[None]] = set()


def cancel_statement(conn: Any) -> None:
    """Ask the server, in the background, to cancel the statement `conn` runs: a CancelRequest on
    a connection of its own, as asyncpg sends for a query whose task is cancelled. A connection
    closed under a running statement does not stop it: the server notices only when it writes
    the answer, and until then the statement holds its row locks and its snapshot (a heartbeat
    given up on a slow database went on for a minute, holding the rows that the outcome writes
    then waited for, and the MVCC horizon). Closing the connection would drop asyncpg's own
    cancel request with it. Best effort, within CANCEL_TIMEOUT: the database may not answer."""
    raw = getattr(conn, "_con", conn)  # a pool's proxy, or the connection itself
    try:
        target = {
            "addr": raw._addr,
            "params": raw._params,
            "backend_pid": raw._protocol.backend_pid,
            "backend_secret": raw._protocol.backend_secret,
        }
        send = getattr(asyncpg.connect_utils, "_cancel")  # noqa: B009 (no public reader)
        loop = asyncio.get_running_loop()
    except (AttributeError, RuntimeError):  # another asyncpg, or no loop: the close alone
        return

    async def request() -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_TIMEOUT):
                await send(loop=loop, **target)

    task = loop.create_task(request(), name="pgworker-cancel")
    _cancels.add(task)
    task.add_done_callback(_cancels.discard)


class HeldConnection:
    """One pooled connection kept across statements by a hot loop (the claim, the outcome writes),
    sparing the pool's acquire and release per statement; replaced after a connection error."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: PoolConnectionProxy | None = None

    async def get(self) -> PoolConnectionProxy:
        if self._conn is not None and _gone(self._conn):
            # The server ended it: a new one, without a failed try. Given back first: after a
            # protocol abort the pool still counts it as lent until it is released, and a worker's
            # pool of two would be a connection short for good (its claims waiting forever).
            await self.drop()
        if self._conn is None:
            self._conn = await self._pool.acquire()
        return self._conn

    async def discard(self) -> None:
        """Close the connection rather than give it back: it may be in the middle of a
        statement that was cancelled."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # Already handed back (the pool takes back a connection the server ended): the
            # proxy refuses any call, and there is nothing left to close.
            with contextlib.suppress(asyncpg.exceptions.InterfaceError):
                conn.terminate()
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._pool.release(conn)

    def abandon(self) -> None:
        """Close the connection at once, whatever statement it waits on (a database that stopped
        answering: on a network that drops packets, it might wait for minutes after the network
        heals); the statement fails as on a lost connection, and the next `get` takes another.
        The server is asked to cancel that statement first (`cancel_statement`)."""
        if self._conn is not None and not _gone(self._conn):
            cancel_statement(self._conn)
            self._conn.terminate()

    async def drop(self) -> None:
        """Give the connection back (after an error, or when done); the next `get` takes another."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A connection that died was already handed back by the pool: nothing left to do.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._pool.release(conn)


class SharedConnection:
    """A worker's second connection (the first is its claims'), seen as a pool of one: the
    outcome writes, the heartbeat, the maintenance and the steps' records take turns on it, one
    statement or one short transaction at a time. None of them needs a connection of its own:
    each holds it for milliseconds, where a pool of one connection per user kept most of them
    idle. A borrower cancelled in the middle of a statement closes it (its statement may still
    run); the next borrower takes another."""

    def __init__(self, pool: asyncpg.Pool, *, pooler: bool = False) -> None:
        self._pool = pool
        self._held = HeldConnection(pool)
        self._turn = asyncio.Lock()
        self.through_pooler = pooler
        """Whether its pool's connections are PoolerConnections (see `through_pooler`)."""

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[PoolConnectionProxy]:
        async with self._turn:
            conn = await self._held.get()
            try:
                yield conn
            except Exception:
                raise
            except BaseException:
                self._held.abandon()
                raise

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args, **kwargs)

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.execute(query, *args, **kwargs)

    async def call_pooled(self, call: str, *args: Any) -> Any:
        """As PoolerConnection.call_pooled, on a pooler mode pool."""
        async with self.acquire() as conn:
            return await cast(PoolerConnection, conn).call_pooled(call, *args)

    def abandon(self) -> None:
        """Close the connection now, whoever waits on it (see HeldConnection.abandon)."""
        self._held.abandon()

    async def drop(self) -> None:
        """Give the connection back after an error; the next borrower takes another."""
        async with self._turn:
            await self._held.drop()

    async def expire_connections(self) -> None:
        """As the pool's (see `recover`): the connection is replaced at its next use."""
        await self._pool.expire_connections()
        await self.drop()

    async def discard(self) -> None:
        """Close the connection rather than give it back: its last user was cancelled."""
        self._held.abandon()
        async with self._turn:
            await self._held.discard()


Runner = Executor | SharedConnection
"""Where pgworker's own statements may run: an Executor, or a worker's shared connection."""


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
        f"the server refuses more connections ({exc}); a worker needs 3 (claims, the one its "
        "other services share, and the listener) and one more per transactional step open at "
        "once: raise the role's CONNECTION LIMIT or max_connections, run fewer processes, or "
        "put PgBouncer in front (--pooler)"
    )
