"""The schema: applying the numbered migrations of `sql/migrations`, and checking that the
database holds what this code needs before a worker starts."""

from __future__ import annotations

from .._logs import get_logger
from ..errors import PrivilegeError, SchemaError
from . import files
from .connection import Conn, Executor, migrate_command, pooler_needed
from .queries import queries, transaction

_log = get_logger()

MIN_SERVER_MAJOR = 14
"""The oldest PostgreSQL major pgworker is tested on (`make test-matrix`,
docs/operations/versions.md)."""


async def check_server(conn: Conn, schema: str) -> None:
    """Raise SchemaError, before anything is written, when the server is older than
    MIN_SERVER_MAJOR."""
    version, major = await queries(schema).server_version(conn)
    if major < MIN_SERVER_MAJOR:
        raise SchemaError(
            f"PostgreSQL {version} is older than pgworker supports: it needs PostgreSQL "
            f"{MIN_SERVER_MAJOR} or newer; upgrade the server, then run "
            f"`{migrate_command(schema)}` again"
        )


async def check_direct(conn: Executor, schema: str) -> None:
    """Raise ConfigError, naming the pooler option, when the session did not get the startup
    parameters a direct pool asks for: a pooler in between ignores them (PgBouncer's
    ignore_startup_parameters), and would hand the session's prepared statements to others."""
    found = await queries(schema).session_settings(conn)
    if found != "force_generic_plan":
        raise pooler_needed(f"the startup parameter plan_cache_mode was ignored, found {found!r}")


async def migrate(conn: Conn, schema: str, *, pooler: bool = False) -> list[int]:
    """Apply the migrations not yet applied, each in its own transaction, under an advisory lock
    so that concurrent runs apply each migration once. Returns the versions applied now. A
    server older than MIN_SERVER_MAJOR is refused first. With `pooler` (a transaction pooler in
    front, which keeps no session lock), all of them in one transaction under a
    transaction-level lock, then the worker's pooled functions (`Queries.pooled_functions`).
    Either way, the pooled functions no one may call any more are dropped (`_prune`)."""
    await check_server(conn, schema)
    q = queries(schema)
    if pooler:
        async with transaction(conn) as c:
            await q.migrations_lock_xact(c)
            applied = await _apply(c, schema)
            await q.pooled_functions(c)
            await _prune(c, schema)
            return applied
    await q.migrations_lock(conn)
    try:
        applied = await _apply(conn, schema)
        async with transaction(conn) as c:
            await _prune(c, schema)
        return applied
    finally:
        await q.migrations_unlock(conn)


async def _prune(conn: Conn, schema: str) -> None:
    """Drop the pooled functions of older releases that no registered worker calls (each
    worker says which it calls: workers.functions), under the migrations' lock. Not when the
    schema is newer than this code: a newer release's migrate knows its own functions."""
    if await schema_version(conn, schema) != files.latest_version():
        return
    q = queries(schema)
    unused = await q.pooled_functions_unused(conn)
    for function in unused:
        await q.pooled_function_drop(conn, function["signature"])
    if unused:
        _log.info("pooled functions dropped", functions=[f["name"] for f in unused])


async def _apply(conn: Conn, schema: str) -> list[int]:
    """Under the migrations' lock: each migration not yet applied, in a transaction (a
    savepoint inside the caller's)."""
    q = queries(schema)
    applied_now = []
    await q.migrations_bootstrap(conn)
    done = await q.migrations_applied(conn)
    for m in files.migrations(schema):
        if m.version in done:
            continue
        async with transaction(conn) as c:
            await c.execute(m.sql)
            await q.migrations_record(c, m.version, m.name)
        applied_now.append(m.version)
    return applied_now


async def schema_version(conn: Executor, schema: str) -> int | None:
    q = queries(schema)
    if not await q.migrations_table_exists(conn):
        return None
    return await q.migrations_latest(conn)


async def check_schema(conn: Executor, schema: str) -> None:
    """Raise SchemaError, saying what to run, unless the schema is exactly at the code's version."""
    expected = files.latest_version()
    found = await schema_version(conn, schema)
    if found is None:
        raise SchemaError(
            f"the pgworker schema {schema!r} is missing; run `{migrate_command(schema)}`"
        )
    if found < expected:
        raise SchemaError(
            f"the pgworker schema {schema!r} is at version {found}, this pgworker needs "
            f"{expected}; run `{migrate_command(schema)}`"
        )
    if found > expected:
        raise SchemaError(
            f"the pgworker schema {schema!r} is at version {found}, newer than this pgworker "
            f"(version {expected}); upgrade pgworker on this host"
        )


async def check_privileges(conn: Executor, schema: str, *, periodic: bool = False) -> None:
    """Raise PrivilegeError naming the first privilege a worker needs and lacks; those on the
    `periodic` table only for a worker with periodic schedules (a role granted its tables before
    migration 14 still runs the others)."""
    missing = [
        r
        for r in await queries(schema).privileges_missing(conn)
        if periodic or not r["object"].endswith(".periodic")
    ]
    if missing:
        needed = ", ".join(f"{r['privilege']} on {r['object']}" for r in missing)
        raise PrivilegeError(
            f"the database role lacks {needed}; grant it (GRANT {missing[0]['privilege']} ON "
            f"{missing[0]['object']} TO <role>) or run the worker as the schema's owner"
        )
