"""The one module that runs SQL: every statement pgworker sends goes through here, and database
errors become pgworker's typed errors."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from . import sql
from .errors import DatabaseUnavailable, PrivilegeError, SchemaError
from .models import AttemptResult

Executor = asyncpg.Connection | asyncpg.Pool

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
    it did not (down, unreachable, a malformed DSN)."""
    where = "(--dsn, PGWORKER_DSN or DATABASE_URL)"
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        return too_many_connections(exc)
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return DatabaseUnavailable(f"{exc}: create it, or fix the database name in the DSN {where}")
    if isinstance(
        exc,
        asyncpg.exceptions.InvalidAuthorizationSpecificationError
        | asyncpg.exceptions.InvalidPasswordError,
    ):
        return DatabaseUnavailable(
            f"the server refused the login ({exc}); check the user and password in the DSN {where}"
        )
    return DatabaseUnavailable(
        f"cannot reach the database ({type(exc).__name__}: {exc}); check the DSN "
        f"{where} and that PostgreSQL is running"
    )


async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
    kwargs.setdefault("timeout", 10)
    try:
        return await asyncpg.connect(dsn, **kwargs)
    except (*CONNECTION_ERRORS, asyncpg.PostgresError, ValueError) as exc:
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
    except (*CONNECTION_ERRORS, asyncpg.PostgresError, ValueError) as exc:
        raise _describe(dsn, exc) from exc


def _gone(conn: asyncpg.Connection) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.exceptions.InterfaceError:  # released back to the pool when it closed
        return True


class HeldConnection:
    """One pooled connection kept across statements by a hot loop (the claim, the outcome writes),
    sparing the pool's acquire and release per statement; replaced after a connection error."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: asyncpg.Connection | None = None

    async def get(self) -> asyncpg.Connection:
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

    async def drop(self) -> None:
        """Give the connection back (after an error, or when done); the next `get` takes another."""
        conn, self._conn = self._conn, None
        if conn is not None:
            # A connection that died was already handed back by the pool: nothing left to do.
            with contextlib.suppress(*CONNECTION_ERRORS):
                await self._pool.release(conn)


@contextlib.asynccontextmanager
async def transaction(conn: Executor) -> AsyncIterator[asyncpg.Connection]:
    """A transaction on `conn` (a savepoint inside the caller's), or on a connection of a pool."""
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as c, c.transaction():
            yield c
    else:
        async with conn.transaction():
            yield conn


@contextlib.contextmanager
def _schema_errors(schema: str) -> Any:
    try:
        yield
    except (asyncpg.exceptions.UndefinedTableError, asyncpg.exceptions.InvalidSchemaNameError) as e:
        raise SchemaError(
            f"the pgworker schema {schema!r} is missing ({e}); run `pgworker migrate` first"
        ) from e


# --- schema -------------------------------------------------------------------------------


async def migrate(conn: asyncpg.Connection, schema: str) -> list[int]:
    """Apply the migrations not yet applied, each in its own transaction, under an advisory lock
    so that concurrent runs apply each migration once. Returns the versions applied now."""
    q = sql.queries(schema)
    applied_now = []
    await conn.execute(q["migrations_lock"], schema)
    try:
        await conn.execute(q["migrations_bootstrap"])
        done = {r["version"] for r in await conn.fetch(q["migrations_applied"])}
        for m in sql.migrations(schema):
            if m.version in done:
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(q["migrations_record"], m.version, m.name)
            applied_now.append(m.version)
    finally:
        await conn.execute(q["migrations_unlock"], schema)
    return applied_now


async def schema_version(conn: Executor, schema: str) -> int | None:
    q = sql.queries(schema)
    if not await conn.fetchval(q["migrations_table_exists"], schema):
        return None
    return await conn.fetchval(q["migrations_latest"])


async def check_schema(conn: Executor, schema: str) -> None:
    """Raise SchemaError, saying what to run, unless the schema is exactly at the code's version."""
    expected = sql.latest_version()
    found = await schema_version(conn, schema)
    if found is None:
        raise SchemaError(f"the pgworker schema {schema!r} is missing; run `pgworker migrate`")
    if found < expected:
        raise SchemaError(
            f"the pgworker schema {schema!r} is at version {found}, this pgworker needs "
            f"{expected}; run `pgworker migrate`"
        )
    if found > expected:
        raise SchemaError(
            f"the pgworker schema {schema!r} is at version {found}, newer than this pgworker "
            f"(version {expected}); upgrade pgworker on this host"
        )


async def check_privileges(conn: Executor, schema: str) -> None:
    """Raise PrivilegeError naming the first privilege a worker needs and lacks."""
    try:
        missing = await conn.fetch(sql.queries(schema)["privileges_missing"], schema)
    except asyncpg.exceptions.InsufficientPrivilegeError as exc:
        raise privilege_error(schema, exc) from exc
    if missing:
        needed = ", ".join(f"{r['privilege']} on {r['object']}" for r in missing)
        raise PrivilegeError(
            f"the database role lacks {needed}; grant it (GRANT {missing[0]['privilege']} ON "
            f"{missing[0]['object']} TO <role>) or run the worker as the schema's owner"
        )


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


# --- enqueue ------------------------------------------------------------------------------


async def insert_job(conn: Executor, schema: str, *args: Any) -> asyncpg.Record | None:
    with _schema_errors(schema):
        return await conn.fetchrow(sql.queries(schema)["job_insert"], *args)


async def insert_jobs(conn: asyncpg.Connection, schema: str, batch: str) -> list[asyncpg.Record]:
    """Insert the jobs of `batch`, a JSON array (see job_insert_many.sql)."""
    with _schema_errors(schema):
        return await conn.fetch(sql.queries(schema)["job_insert_many"], batch)


async def reserve_job_ids(conn: asyncpg.Connection, schema: str, n: int) -> tuple[list[int], Any]:
    """`n` new job ids for a batch that COPY writes, and the transaction's time."""
    with _schema_errors(schema):
        reserved = await conn.fetchrow(sql.queries(schema)["job_ids_reserve"], n)
    return reserved["ids"], reserved["now"]


async def copy_jobs(
    conn: asyncpg.Connection, schema: str, columns: list[str], chunks: AsyncIterable[bytes]
) -> None:
    """Write rows into `jobs` with COPY (text format), the fastest path in; each chunk is sent as
    soon as it is made."""
    with _schema_errors(schema):
        await conn.copy_to_table(
            "jobs", schema_name=schema, columns=columns, source=chunks, format="text"
        )


async def get_jobs_by_keys(
    conn: Executor, schema: str, keys: Sequence[str], types: Sequence[str], payloads: Sequence[str]
) -> dict[str, asyncpg.Record]:
    """The jobs holding `keys`, keyed by key, each with `matches`: created with that type and
    payload or not."""
    with _schema_errors(schema):
        rows = await conn.fetch(sql.queries(schema)["job_get_by_keys"], keys, types, payloads)
    return {r["requested_key"]: r for r in rows}


async def get_job(conn: Executor, schema: str, job_id: int) -> asyncpg.Record | None:
    with _schema_errors(schema):
        return await conn.fetchrow(sql.queries(schema)["job_get"], job_id)


# --- worker -------------------------------------------------------------------------------


def _outcome_arrays(results: Sequence[AttemptResult]) -> list[list[Any]]:
    return [
        [r.job_id for r in results],
        [r.attempt for r in results],
        [r.status.value for r in results],
        [r.outcome.value for r in results],
        [r.result for r in results],
        [r.error_type for r in results],
        [r.error_message for r in results],
        [r.delay for r in results],
        [r.retried for r in results],
        [r.claimed_at for r in results],
    ]


async def claim(
    conn: Executor,
    schema: str,
    *,
    queues: Sequence[str],
    types: Sequence[str],
    default_max_retries: Sequence[int],
    limit: int,
    worker_id: str,
    lease: float,
    code_version: str | None,
    durable: bool = False,
) -> list[asyncpg.Record]:
    """Claim up to `limit` jobs in one statement; the rows carry the columns the claim did not
    set itself (see job_claim.sql). Unless `durable`, the claim commits without waiting for its
    WAL flush."""
    return await conn.fetch(
        sql.queries(schema)["job_claim"],
        queues,
        types,
        limit,
        worker_id,
        lease,
        default_max_retries,
        code_version,
        None if durable else "off",
    )


_ATTEMPT_KEY = re.compile(r"\(job_id, attempt\)=\((\d+), \d+\)")


def attempt_conflict(exc: BaseException) -> int | None:
    """The job whose claim found its attempt number taken (its `attempts` was reset by hand)."""
    if not isinstance(exc, asyncpg.exceptions.UniqueViolationError):
        return None
    found = _ATTEMPT_KEY.search(getattr(exc, "detail", None) or "")
    return int(found.group(1)) if found else None


async def repair_attempts(conn: Executor, schema: str, job_id: int) -> None:
    """Number the job's next attempt after its last recorded one."""
    await conn.execute(sql.queries(schema)["job_attempts_repair"], job_id)


async def finish_many(conn: Executor, schema: str, results: Sequence[AttemptResult]) -> set[int]:
    """Write outcomes in one statement; returns the job ids written (the others were fenced)."""
    rows = await conn.fetch(sql.queries(schema)["job_finish_many"], *_outcome_arrays(results))
    return {r["id"] for r in rows}


def _attempt_arrays(attempts: Sequence[tuple[int, int, datetime]]) -> list[list[Any]]:
    """(job id, attempt, claimed at) triples as three aligned arrays, the statements' parameters."""
    return [
        [job_id for job_id, _, _ in attempts],
        [attempt for _, attempt, _ in attempts],
        [claimed_at for _, _, claimed_at in attempts],
    ]


async def attempt_outcomes(
    conn: Executor, schema: str, attempts: Sequence[tuple[int, int, datetime]]
) -> dict[int, str]:
    """The recorded outcome of (job id, attempt, claimed at) attempts, by job id."""
    rows = await conn.fetch(sql.queries(schema)["attempt_outcomes"], *_attempt_arrays(attempts))
    return {r["job_id"]: r["outcome"] for r in rows}


async def register_worker(
    conn: Executor,
    schema: str,
    worker_id: str,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    types: Sequence[str],
    concurrency: int,
) -> None:
    await conn.execute(
        sql.queries(schema)["worker_register"],
        worker_id,
        hostname,
        pid,
        list(queues),
        list(types),
        concurrency,
    )


async def heartbeat(
    conn: Executor, schema: str, running: Sequence[tuple[int, int, datetime]], lease: float
) -> dict[int, bool]:
    """Extend the leases of `running` (job id, attempt, claimed at) attempts in one statement.
    Returns the (job id, attempt) still held, each with whether an operator asked to cancel it."""
    rows = await conn.fetch(
        sql.queries(schema)["worker_heartbeat"], *_attempt_arrays(running), lease
    )
    return {(r["id"], r["attempts"]): r["cancel_requested"] for r in rows}


async def unregister_worker(conn: Executor, schema: str, worker_id: str) -> None:
    await conn.execute(sql.queries(schema)["worker_unregister"], worker_id)


# --- maintenance --------------------------------------------------------------------------


async def lead(conn: Executor, schema: str, worker_id: str, lease: float) -> bool:
    """Take the maintenance leadership, or renew it, for `lease` seconds: a lease row, taken only
    when free or expired, so that a leader that freezes loses it when its lease runs out."""
    return await conn.fetchval(sql.queries(schema)["leader_take"], worker_id, lease) is not None


async def resign(conn: Executor, schema: str, worker_id: str) -> None:
    """Give the leadership up (a stopping worker), so that another worker takes it at once."""
    await conn.execute(sql.queries(schema)["leader_release"], worker_id)


async def rescue(
    conn: Executor,
    schema: str,
    worker_id: str,
    *,
    only: Sequence[int] | None = None,
    skip: Sequence[int] = (),
) -> list[asyncpg.Record]:
    """Requeue (or fail) jobs whose lease expired (`only` these, if given; never those in
    `skip`), if `worker_id` still leads; returns them with their new status."""
    return await conn.fetch(
        sql.queries(schema)["jobs_rescue"],
        channel(schema),
        worker_id,
        None if only is None else list(only),
        list(skip),
    )


async def expired_jobs(conn: Executor, schema: str, skip: Sequence[int] = ()) -> list[int]:
    """Ids of jobs whose lease expired, but those in `skip`, oldest first."""
    return [r["id"] for r in await conn.fetch(sql.queries(schema)["jobs_expired"], list(skip))]


async def prune_workers(conn: Executor, schema: str, unseen_for: float) -> None:
    await conn.execute(sql.queries(schema)["workers_prune"], unseen_for)


async def notify(conn: asyncpg.Connection, schema: str, channel: str, payload: str) -> None:
    await conn.execute(sql.queries(schema)["notify"], channel, payload)


def channel(schema: str) -> str:
    """The NOTIFY channel that announces new jobs; the payload is the queue."""
    return f"{schema}_jobs"


def cancel_channel(schema: str) -> str:
    """The NOTIFY channel that asks workers to cancel a running job; the payload is its id."""
    return f"{schema}_cancel"


# --- operators ----------------------------------------------------------------------------


async def cancel(conn: Executor, schema: str, job_id: int) -> asyncpg.Record | None:
    """Cancel a job; returns its previous status (and worker), or None when it does not exist.
    A running job's worker is notified when the transaction commits."""
    q = sql.queries(schema)
    with _schema_errors(schema):
        async with transaction(conn) as c:
            row = await c.fetchrow(q["job_cancel"], job_id)
            if row is not None and row["previous"] == "running":
                await c.execute(q["notify"], cancel_channel(schema), str(job_id))
            return row


async def status(conn: Executor, schema: str, live_within: float) -> dict[str, list[Any]]:
    q = sql.queries(schema)
    with _schema_errors(schema):
        return {
            "counts": await conn.fetch(q["status_counts"]),
            "oldest_pending": await conn.fetch(q["status_oldest_pending"]),
            "unserved": await conn.fetch(q["status_unserved"], live_within),
            "workers": await conn.fetch(q["status_workers"], live_within),
        }
