"""Enqueue through a connection of another driver: psycopg 3, SQLAlchemy, Django.

Such a connection is wrapped in an adapter that offers the few asyncpg methods the enqueue path
calls (`fetch`, `fetchrow`, `transaction`), so that `pgworker.enqueue` runs the very statements
and checks it runs on asyncpg: the same rows, errors and idempotency behaviour by construction.
Placeholders (`$1`) are rewritten into the driver's style. A driver is recognised by the module
of the object's type, never by importing it: `import pgworker` imports none of them.

The synchronous adapters (pgworker.sync) block inside their `async def` methods and never
suspend, so `run_sync` drives the same coroutine to its end without an event loop.
"""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar, cast

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ._db.connection import Executor, migrate_command
from .errors import ConfigError, DatabaseUnavailable, PgWorkerError, SchemaError

T = TypeVar("T")

NATIVE: frozenset[Any] = frozenset({asyncpg.Connection, PoolConnectionProxy, asyncpg.Pool})
"""The types of the fast path, tested before anything else."""

ASYNC_ACCEPTED = (
    "an asyncpg Connection or Pool, a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection "
    "or AsyncSession"
)
SYNC_ACCEPTED = (
    "a psycopg Connection, a SQLAlchemy Connection or Session, or a Django connection "
    "(django.db.connection or connections[alias])"
)

_PLACEHOLDER = re.compile(r"\$(\d+)")
_SAVEPOINT = "pgworker_enqueue"

_ABORTED_STATES = frozenset({"25P02"})  # in_failed_sql_transaction
_MISSING_STATES = frozenset({"42P01", "3F000"})  # undefined table, invalid schema name
# duplicate_prepared_statement, invalid_sql_statement_name: a statement prepared by name on one
# server session, met on another (or by another client) behind a transaction pooler.
_KEPT_STATEMENT_STATES = frozenset({"42P05", "26000"})
_STATEMENT_CACHE = {
    "asyncpg": "create its pool or connection with statement_cache_size=0",
    "psycopg": "connect with prepare_threshold=None",
}
_ANY_CACHE = (
    "turn its driver's statement cache off (asyncpg: statement_cache_size=0; psycopg: "
    "prepare_threshold=None)"
)


def _kinds(conn: object) -> set[str]:
    """`package.Class` of the object's type and its bases: how a driver is told apart (the
    package only: psycopg, for one, says its classes are of the module `psycopg`)."""
    return {f"{c.__module__.partition('.')[0]}.{c.__qualname__}" for c in type(conn).__mro__}


_ASYNC_KINDS: dict[str, str] = {
    "psycopg.AsyncConnection": "psycopg",
    "sqlalchemy.AsyncConnection": "sqlalchemy-connection",
    "sqlalchemy.AsyncSession": "sqlalchemy-session",
    "sqlalchemy.async_scoped_session": "sqlalchemy-session",
}
_SYNC_KINDS: dict[str, str] = {
    "psycopg.Connection": "psycopg",
    "sqlalchemy.Connection": "sqlalchemy-connection",
    "sqlalchemy.Session": "sqlalchemy-session",
    "sqlalchemy.scoped_session": "sqlalchemy-session",
    "django.ConnectionProxy": "django",
    "django.BaseDatabaseWrapper": "django",
}


def _kind(conn: object, table: Mapping[str, str]) -> str | None:
    for name in _kinds(conn):
        if name in table:
            return table[name]
    return None


def is_adapter(conn: object) -> bool:
    return isinstance(conn, _Adapter)


def adapt(conn: Any) -> Executor:
    """`conn` as the enqueue path needs it: asyncpg objects as they are, an adapter around an
    asynchronous connection of another driver; TypeError for anything else."""
    if isinstance(conn, asyncpg.Connection | PoolConnectionProxy | asyncpg.Pool | _Adapter):
        return cast(Executor, conn)
    kind = _kind(conn, _ASYNC_KINDS)
    if kind == "psycopg":
        return cast(Executor, _Psycopg(conn))
    if kind == "sqlalchemy-connection":
        return cast(Executor, _SQLAlchemy(conn, session=False))
    if kind == "sqlalchemy-session":
        return cast(Executor, _SQLAlchemy(conn, session=True))
    if _kind(conn, _SYNC_KINDS) is not None:
        raise TypeError(
            f"{type(conn).__name__} is a synchronous connection: use pgworker.sync.enqueue "
            "(or enqueue_many) with it, or pass " + ASYNC_ACCEPTED
        )
    raise TypeError(f"conn must be {ASYNC_ACCEPTED}; got {type(conn).__name__}")


def adapt_sync(conn: Any) -> Executor:
    """A synchronous connection of another driver, as an adapter; TypeError for anything else."""
    kind = _kind(conn, _SYNC_KINDS)
    if kind == "psycopg":
        return cast(Executor, _SyncPsycopg(conn))
    if kind == "sqlalchemy-connection":
        return cast(Executor, _SyncSQLAlchemy(conn, session=False))
    if kind == "sqlalchemy-session":
        return cast(Executor, _SyncSQLAlchemy(conn, session=True))
    if kind == "django":
        return cast(Executor, _Django(conn))
    if isinstance(conn, asyncpg.Connection | PoolConnectionProxy | asyncpg.Pool) or _kind(
        conn, _ASYNC_KINDS
    ):
        raise TypeError(
            f"{type(conn).__name__} is an asynchronous connection: use `await "
            "pgworker.enqueue(...)` (or enqueue_many) with it, or pass " + SYNC_ACCEPTED
        )
    raise TypeError(f"conn must be {SYNC_ACCEPTED}; got {type(conn).__name__}")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (the enqueue path on a synchronous
    adapter), without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    raise RuntimeError("the enqueue path suspended on a synchronous connection")  # a bug


@lru_cache(maxsize=64)
def _rewrite(sql: str, style: str) -> tuple[str, tuple[int, ...]]:
    """`sql` with `$n` placeholders in a DB-API `style`, and for positional styles the
    parameter index of each placeholder in order (a parameter used twice is sent twice)."""
    if style in ("pyformat", "format"):
        sql = sql.replace("%", "%%")
    order: list[int] = []

    def one(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if style == "pyformat":
            return f"%(p{n})s"
        if style == "named":
            return f":p{n}"
        if style == "numeric_dollar":
            return match.group(0)
        if style == "numeric":
            return f":{n}"
        order.append(n - 1)
        return "%s" if style == "format" else "?"

    return _PLACEHOLDER.sub(one, sql), tuple(order)


def _params(style: str, order: tuple[int, ...], args: Sequence[Any]) -> Any:
    if style in ("pyformat", "named"):
        return {f"p{n}": value for n, value in enumerate(args, 1)}
    if style in ("numeric_dollar", "numeric"):
        return tuple(args)
    return tuple(args[i] for i in order)


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, through the wrappers of SQLAlchemy and Django."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        for attribute in ("sqlstate", "pgcode"):
            state = getattr(seen, attribute, None)
            if isinstance(state, str):
                return state
        seen = getattr(seen, "orig", None) or seen.__cause__
    return None


def aborted(driver: str) -> PgWorkerError:
    return PgWorkerError(
        f"the {driver}'s transaction is aborted (an earlier statement in it failed); "
        "roll it back, then enqueue: nothing was written"
    )


def kept_statements(driver: str, exc: BaseException) -> ConfigError:
    """The error of a connection that keeps prepared statements across transactions, through a
    transaction pooler such as PgBouncer, which hands them to other clients."""
    fix = _STATEMENT_CACHE.get(driver.partition(" ")[0], _ANY_CACHE)
    seen = str(exc).partition("\n")[0]  # asyncpg appends a long hint about PgBouncer
    return ConfigError(
        "conn",
        f"the {driver} keeps prepared statements, and reaches PostgreSQL through a transaction "
        f"pooler such as PgBouncer, which gives them to other clients ({type(exc).__name__}: "
        f"{seen}); nothing was written: {fix}, then enqueue again",
    )


def closed(driver: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"the {driver} is closed; reconnect (or take another connection from the pool), then "
        "enqueue on the open connection: nothing was written"
    )


_LOST_STATES = ("57P01", "57P02", "57P03")
"""A server shutting down (by an administrator, after a crash) or starting: the session is gone,
as with any SQLSTATE of class 08 (connection exception)."""


def connection_lost(conn: Any, exc: BaseException) -> DatabaseUnavailable | None:
    """The error of an enqueue whose connection to PostgreSQL was lost (a server shut down, a
    network cut, a connection refused), whatever the driver and wherever it happened (mid-COPY,
    in a pool's connection, in the rollback after it): DatabaseUnavailable. None for any other
    error. The exception's chain is read through drivers' and SQLAlchemy's wrappers."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        state = getattr(seen, "sqlstate", None) or getattr(seen, "pgcode", None)
        below = getattr(seen, "orig", None) or seen.__cause__ or seen.__context__
        if (
            (isinstance(state, str) and (state.startswith("08") or state in _LOST_STATES))
            or (isinstance(seen, OSError) and not isinstance(seen, TimeoutError))
            # psycopg's error for a connection that failed without a server's word
            or (type(seen).__name__ == "OperationalError" and state is None and below is None)
            or (isinstance(seen, asyncpg.exceptions.InternalClientError) and _native_closed(conn))
        ):
            return DatabaseUnavailable(
                f"the connection to PostgreSQL was lost during the enqueue ({type(seen).__name__}: "
                f"{seen}); a job is written only if its transaction committed before: reconnect, "
                "then enqueue again (with an idempotency_key, an enqueue of a job already written "
                "returns it)"
            )
        seen = below
    return None


KEPT_STATEMENT: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DuplicatePreparedStatementError,
    asyncpg.exceptions.InvalidSQLStatementNameError,
)
"""What asyncpg raises when its cached statements meet a transaction pooler."""

UNUSABLE: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InFailedSQLTransactionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    *KEPT_STATEMENT,
)
"""What asyncpg raises on a connection that cannot enqueue (see `unusable`)."""


def _native_closed(conn: Any) -> bool:
    if isinstance(conn, asyncpg.Pool):
        return conn.is_closing()
    try:
        return bool(conn.is_closed())
    except asyncpg.exceptions.InterfaceError:  # a pooled connection released to its pool
        return True


def unusable(conn: Any, exc: BaseException) -> PgWorkerError | None:
    """An asyncpg error on the enqueue path as the error the other drivers raise, saying what
    to do: an aborted transaction (roll it back), a closed connection or pool (reconnect).
    None for anything else, which is raised as it is."""
    if is_adapter(conn):
        return None
    driver = "asyncpg Pool" if isinstance(conn, asyncpg.Pool) else "asyncpg Connection"
    if isinstance(exc, asyncpg.exceptions.InFailedSQLTransactionError):
        return aborted(driver)
    if isinstance(exc, KEPT_STATEMENT):
        return kept_statements(driver, exc)
    if _native_closed(conn):
        return closed(driver)
    return None


@contextlib.contextmanager
def _driver_errors(driver: str, schema: str) -> Iterator[None]:
    """A driver's error as pgworker's: a missing schema, an aborted transaction."""
    try:
        yield
    except Exception as exc:
        state = _sqlstate(exc)
        name = type(exc).__name__
        if state in _ABORTED_STATES or name in (
            "PendingRollbackError",
            "TransactionManagementError",
        ):
            raise aborted(driver) from exc
        if state in _KEPT_STATEMENT_STATES:
            raise kept_statements(driver, exc) from exc
        if state in _MISSING_STATES:
            raise SchemaError(
                f"the pgworker schema {schema!r} is missing ({exc}); run "
                f"`{migrate_command(schema)}` first"
            ) from exc
        raise


class _Adapter(abc.ABC):
    """What every adapter has: the driver's name for messages, and its parameter style."""

    driver = "?"
    style = "pyformat"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def fetchrow(self, sql: str, *args: Any) -> Mapping[str, Any] | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    @abc.abstractmethod
    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        """Run `sql` with `args` on the driver's connection; its rows by column name."""

    def _schema(self, sql: str) -> str:
        found = re.search(r'"([A-Za-z_][A-Za-z0-9_]*)"\.', sql)
        return found.group(1) if found else "pgworker"


def _rows(description: Any, values: list[Any]) -> list[Mapping[str, Any]]:
    names = [d[0] for d in description or ()]
    return [dict(zip(names, row, strict=True)) for row in values]


# --- psycopg 3 -------------------------------------------------------------------------------


def _dict_rows(cursor: Any) -> Any:
    """A psycopg row factory: rows as dicts, whatever row factory the caller's connection has."""
    names = [column.name for column in cursor.description or ()]
    return lambda values: dict(zip(names, values, strict=True))


def _psycopg_state(conn: Any, driver: str) -> str:
    """`idle`, `intrans`, or an error: the connection closed, its transaction aborted."""
    if conn.closed:
        raise closed(driver)
    status = conn.info.transaction_status.name
    if status == "INERROR":
        raise aborted(driver)
    if status not in ("IDLE", "INTRANS"):
        raise PgWorkerError(f"the {driver} is busy ({status}); enqueue between statements")
    return "idle" if status == "IDLE" else "intrans"


class _Psycopg(_Adapter):
    driver = "psycopg AsyncConnection"

    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        _psycopg_state(self.conn, self.driver)
        text, order = _rewrite(sql, self.style)
        with _driver_errors(self.driver, self._schema(sql)):
            async with self.conn.cursor(row_factory=_dict_rows) as cur:
                await cur.execute(text, _params(self.style, order, args))
                return await cur.fetchall()  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Psycopg]:
        """A savepoint inside the caller's transaction; with autocommit on and no transaction
        open, a transaction of its own (as asyncpg does)."""
        state = _psycopg_state(self.conn, self.driver)
        if state == "idle" and self.conn.autocommit:
            async with self.conn.transaction():
                yield self
            return
        # Not autocommit: the savepoint opens the caller's implicit transaction, left open.
        await self.conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            yield self
        except BaseException:
            if not self.conn.closed:
                with contextlib.suppress(Exception):  # the error raised says more
                    await self.conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    await self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            raise
        await self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")


class _SyncPsycopg(_Adapter):
    driver = "psycopg Connection"

    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        _psycopg_state(self.conn, self.driver)
        text, order = _rewrite(sql, self.style)
        with (
            _driver_errors(self.driver, self._schema(sql)),
            self.conn.cursor(row_factory=_dict_rows) as cur,
        ):
            cur.execute(text, _params(self.style, order, args))
            return cur.fetchall()  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SyncPsycopg]:
        state = _psycopg_state(self.conn, self.driver)
        if state == "idle" and self.conn.autocommit:
            with self.conn.transaction():
                yield self
            return
        self.conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            yield self
        except BaseException:
            if not self.conn.closed:
                with contextlib.suppress(Exception):  # the error raised says more
                    self.conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
                    self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            raise
        self.conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")


# --- SQLAlchemy ------------------------------------------------------------------------------


def _check_dialect(dialect: Any, driver: str) -> str:
    if dialect.name != "postgresql":
        raise TypeError(f"the {driver} must be on PostgreSQL, not {dialect.name}")
    return str(dialect.paramstyle)


def _sqlalchemy_closed(conn: Any, driver: str) -> None:
    if getattr(conn, "closed", False) or getattr(conn, "invalidated", False):
        raise closed(driver)


class _SQLAlchemy(_Adapter):
    """An AsyncConnection or an AsyncSession: statements run in its transaction (begun if
    none is), which the caller commits."""

    def __init__(self, conn: Any, *, session: bool) -> None:
        super().__init__(conn)
        self.session = session
        self.driver = f"SQLAlchemy {type(conn).__name__}"

    async def _connection(self) -> Any:
        if self.session:
            with _driver_errors(self.driver, "pgworker"):
                return await self.conn.connection()
        _sqlalchemy_closed(self.conn, self.driver)
        return self.conn

    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        conn = await self._connection()
        _sqlalchemy_closed(conn, self.driver)
        style = _check_dialect(conn.dialect, self.driver)
        text, order = _rewrite(sql, style)
        with _driver_errors(self.driver, self._schema(sql)):
            result = await conn.exec_driver_sql(text, _params(style, order, args))
            return [dict(r) for r in result.mappings().all()]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SQLAlchemy]:
        await self._connection()
        with _driver_errors(self.driver, "pgworker"):
            nested = await self.conn.begin_nested()
        try:
            yield self
        except BaseException:
            if nested.is_active:
                await nested.rollback()
            raise
        await nested.commit()


class _SyncSQLAlchemy(_Adapter):
    def __init__(self, conn: Any, *, session: bool) -> None:
        super().__init__(conn)
        self.session = session
        self.driver = f"SQLAlchemy {type(conn).__name__}"

    def _connection(self) -> Any:
        if self.session:
            with _driver_errors(self.driver, "pgworker"):
                return self.conn.connection()
        _sqlalchemy_closed(self.conn, self.driver)
        return self.conn

    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        conn = self._connection()
        _sqlalchemy_closed(conn, self.driver)
        style = _check_dialect(conn.dialect, self.driver)
        text, order = _rewrite(sql, style)
        with _driver_errors(self.driver, self._schema(sql)):
            result = conn.exec_driver_sql(text, _params(style, order, args))
            return [dict(r) for r in result.mappings().all()]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SyncSQLAlchemy]:
        self._connection()
        with _driver_errors(self.driver, "pgworker"):
            nested = self.conn.begin_nested()
        try:
            yield self
        except BaseException:
            if nested.is_active:
                nested.rollback()
            raise
        nested.commit()


# --- Django ----------------------------------------------------------------------------------


class _Django(_Adapter):
    """Django's `connection` (or `connections[alias]`): inside `transaction.atomic` the job
    commits with the view's transaction; outside it, Django's autocommit commits it at once."""

    driver = "Django connection"
    style = "pyformat"

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        if conn.vendor != "postgresql":
            raise TypeError(f"the Django connection must be on PostgreSQL, not {conn.vendor}")

    def _check(self) -> None:
        if self.conn.in_atomic_block and self.conn.needs_rollback:
            raise aborted(self.driver)

    async def fetch(self, sql: str, *args: Any) -> list[Mapping[str, Any]]:
        self._check()
        text, order = _rewrite(sql, self.style)
        with _driver_errors(self.driver, self._schema(sql)), self.conn.cursor() as cur:
            cur.execute(text, _params(self.style, order, args))
            return _rows(cur.description, cur.fetchall())

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_Django]:
        self._check()
        from django.db import transaction  # type: ignore[import-untyped]  # Django is there

        with transaction.atomic(using=self.conn.alias):
            yield self
