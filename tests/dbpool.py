"""Migrated databases for the tests, made once and reset between tests: a `CREATE DATABASE ...
TEMPLATE` per test cost about 0.2 s of a 2-core machine, a reset a fraction of it.

After a test its database is made to look new again: its sessions are ended; what the test
added (its tables, functions, triggers, schemas, the pooled functions a pooler worker made: every
object newer than the template, whose OIDs the server hands out in increasing order) is dropped;
the tables written to are emptied and the sequences used restarted; the database's settings,
activity counters and planner statistics are reset. Then a fingerprint of what a test could see
(the catalog of every schema, the database's settings, the applied migrations, the sequences,
the tables' sizes as the planner reads them) must equal the one taken when the database was new.
When it does not (a test altered a pgworker table, say), the database is dropped and a new one
made from the template under another name, and the test is named in a warning: mark it
`fresh_db`, which gives it a database of its own, dropped after it."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


_SCHEMAS = """
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND nspname !~ '^pg_(toast_)?temp_'
"""

NEWEST_OID = """
SELECT greatest((SELECT max(oid) FROM pg_namespace), (SELECT max(oid) FROM pg_class),
                (SELECT max(oid) FROM pg_proc), (SELECT max(oid) FROM pg_type),
                (SELECT max(oid) FROM pg_trigger), (SELECT max(oid) FROM pg_constraint))
"""

# The objects made after the template ($1: its newest OID), named as their DROP takes them.
ADDED = f"""
WITH ns AS ({_SCHEMAS})
SELECT 'SCHEMA' AS kind, format('%I', nspname) AS name FROM ns WHERE oid > $1
UNION ALL
SELECT 'TRIGGER', format('%I ON %I.%I', t.tgname, ns.nspname, c.relname)
FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid JOIN ns ON ns.oid = c.relnamespace
WHERE t.oid > $1 AND NOT t.tgisinternal
UNION ALL
SELECT 'CONSTRAINT', format('%I.%I %I', ns.nspname, c.relname, k.conname)
FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid JOIN ns ON ns.oid = c.relnamespace
WHERE k.oid > $1
UNION ALL
SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                      WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                      WHEN 'i' THEN 'INDEX' WHEN 'I' THEN 'INDEX' ELSE 'TABLE' END,
       format('%I.%I', ns.nspname, c.relname)
FROM pg_class AS c JOIN ns ON ns.oid = c.relnamespace
WHERE c.oid > $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'i', 'I')
UNION ALL
SELECT 'ROUTINE', format('%I.%I(%s)', ns.nspname, p.proname,
                         pg_get_function_identity_arguments(p.oid))
FROM pg_proc AS p JOIN ns ON ns.oid = p.pronamespace WHERE p.oid > $1 AND p.prokind IN ('f', 'p')
UNION ALL
SELECT 'TYPE', format('%I.%I', ns.nspname, t.typname)
FROM pg_type AS t JOIN ns ON ns.oid = t.typnamespace
WHERE t.oid > $1 AND (t.typtype IN ('e', 'd', 'r', 'm')
   OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'))
"""

# What the test wrote ($1: the template's tables but the migrations): the tables to empty row by
# row (a few pages, never vacuumed nor analyzed: the planner reads any table under 10 pages that
# was never vacuumed as 10 pages, so a few dead rows change no estimate, and a TRUNCATE would
# rebuild and fsync each of its indexes), the tables to truncate (bigger, or read by the planner
# as other than new: TRUNCATE makes them new again), the sequences used.
WRITTEN = """
WITH t AS (
    SELECT name, pg_relation_size(name::regclass) AS size,
           (c.relpages, c.reltuples, c.relallvisible) = (0, -1, 0) AS unread
    FROM unnest($1::text[]) AS name JOIN pg_class AS c ON c.oid = name::regclass
)
SELECT
    array(SELECT name FROM t WHERE size > 0 AND unread
          AND size < 10 * current_setting('block_size')::int) AS deleted,
    array(SELECT name FROM t WHERE NOT unread
          OR size >= 10 * current_setting('block_size')::int) AS truncated,
    array(SELECT format('%I.%I', schemaname, sequencename) FROM pg_sequences
          WHERE last_value IS NOT NULL) AS sequences
"""

CATALOG_WRITES = """
SELECT coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)
FROM pg_stat_sys_tables AS s JOIN pg_class AS c ON c.oid = s.relid
WHERE NOT c.relisshared AND s.relname NOT IN ('pg_statistic', 'pg_toast_2619')
"""
"""Rows the database's own catalogs took since the last reset (which ends with pg_stat_reset):
none, and the test made, altered and dropped nothing (PostgreSQL 15 and later, whose sessions
hand in their counts as they end; before 15 the counts come late and the catalog is always
compared)."""

# Everything a test could tell apart, from the catalogs' own columns (no deparsing, which
# would cost a reset more than the reset itself): one digest per catalog.
CATALOG = f"""
WITH ns AS ({_SCHEMAS}),
rel AS (SELECT c.oid FROM pg_class AS c WHERE c.relnamespace IN (SELECT oid FROM ns))
SELECT * FROM (VALUES
  -- privileges compared as what they grant: a GRANT then a REVOKE (or DROP OWNED BY) leaves
  -- the default written out where a new database has NULL
  ('schemas', (SELECT string_agg(
        (x.oid, x.nspname, x.nspowner,
         coalesce(x.nspacl, acldefault('n'::"char", x.nspowner)))::text, ',' ORDER BY x.oid)
       FROM pg_namespace AS x WHERE x.oid IN (SELECT oid FROM ns))),
  ('relations', (SELECT string_agg(
        (x.oid, x.relname, x.relnamespace, x.relkind, x.relowner,
         coalesce(x.relacl, acldefault(CASE x.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char",
                                       x.relowner)),
         x.reloptions,
         x.relnatts, x.relchecks, x.relrowsecurity, x.relpersistence,
         x.relispartition,
         -- a table's size as the planner reads it (an index's is remade by TRUNCATE)
         CASE WHEN x.relkind NOT IN ('i', 'I') THEN (x.relpages, x.reltuples, x.relallvisible)
         END)::text, ',' ORDER BY x.oid)
       FROM pg_class AS x WHERE x.oid IN (SELECT oid FROM rel))),
  ('columns', (SELECT string_agg(
        (x.attrelid, x.attnum, x.attname, x.atttypid, x.atttypmod, x.attnotnull, x.atthasdef,
         x.attisdropped, x.attidentity, x.attgenerated, nullif(x.attacl, '{{}}'), x.attoptions
        )::text, ','
        ORDER BY x.attrelid, x.attnum)
       FROM pg_attribute AS x WHERE x.attrelid IN (SELECT oid FROM rel) AND x.attnum > 0)),
  ('defaults', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_attrdef AS x
                WHERE x.adrelid IN (SELECT oid FROM rel))),
  ('constraints', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_constraint AS x
                   WHERE x.connamespace IN (SELECT oid FROM ns))),
  ('indexes', (SELECT string_agg(x::text, ',' ORDER BY x.indexrelid) FROM pg_index AS x
               WHERE x.indrelid IN (SELECT oid FROM rel))),
  ('triggers', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_trigger AS x
                WHERE x.tgrelid IN (SELECT oid FROM rel))),
  ('rules', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_rewrite AS x
             WHERE x.ev_class IN (SELECT oid FROM rel))),
  ('policies', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_policy AS x
                WHERE x.polrelid IN (SELECT oid FROM rel))),
  ('routines', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_proc AS x
                WHERE x.pronamespace IN (SELECT oid FROM ns))),
  ('types', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_type AS x
             WHERE x.typnamespace IN (SELECT oid FROM ns))),
  ('sequences', (SELECT string_agg(x::text, ',' ORDER BY x.schemaname, x.sequencename)
                 FROM pg_sequences AS x WHERE x.schemaname IN (SELECT nspname FROM ns))),
  ('migrations', (SELECT string_agg(x::text, ',' ORDER BY x::text) FROM pgworker.migrations AS x)),
  ('extensions', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_extension AS x)),
  ('event triggers', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_event_trigger AS x)),
  ('default privileges', (SELECT string_agg(x::text, ',' ORDER BY x.oid)
                          FROM pg_default_acl AS x)),
  ('comments', (SELECT string_agg(x::text, ',' ORDER BY x::text) FROM pg_description AS x
                WHERE x.objoid >= 16384)),
  ('large objects', (SELECT count(*)::text FROM pg_largeobject_metadata)),
  ('publications', (SELECT string_agg(x::text, ',' ORDER BY x.oid) FROM pg_publication AS x)),
  ('database', (SELECT (x.datallowconn, x.datconnlimit, x.datacl, x.datistemplate)::text
                FROM pg_database AS x WHERE x.datname = current_database())),
  ('settings', (SELECT string_agg(x::text, ',' ORDER BY x::text) FROM pg_db_role_setting AS x
                WHERE x.setdatabase = (SELECT oid FROM pg_database
                                       WHERE datname = current_database())))
) AS catalog (name, content)
"""

FINGERPRINT = (
    f"SELECT md5(string_agg(name || ':' || coalesce(content, ''), E'\\n')) FROM ({CATALOG}) AS c"
)
"""The catalog, hashed: one short value to compare after each reset."""

_PLANNER_STATISTICS = f"""
DELETE FROM pg_statistic
WHERE starelid IN (SELECT oid FROM pg_class
                   WHERE relnamespace IN (SELECT oid FROM ({_SCHEMAS}) AS ns))
"""

_DROP = {
    "SCHEMA": "DROP SCHEMA IF EXISTS {} CASCADE",
    "TRIGGER": "DROP TRIGGER IF EXISTS {}",
    "CONSTRAINT": "ALTER TABLE IF EXISTS {} DROP CONSTRAINT IF EXISTS {} CASCADE",
    "ROUTINE": "DROP ROUTINE IF EXISTS {} CASCADE",
    "TYPE": "DROP TYPE IF EXISTS {} CASCADE",
}
_ORDER = ("SCHEMA", "TRIGGER", "CONSTRAINT", "VIEW", "MATERIALIZED VIEW", "TABLE", "FOREIGN TABLE")


def _drop(kind: str, name: str) -> str:
    if kind == "CONSTRAINT":
        table, constraint = name.rsplit(" ", 1)
        return _DROP[kind].format(table, constraint)
    return _DROP.get(kind, f"DROP {kind} IF EXISTS {{}} CASCADE").format(name)


_NUMBERS = itertools.count()
"""The numbers of this process's databases: every pool of it names its own apart."""


class NotFresh(Exception):
    """A database that the reset could not bring back to its template's state."""


class DatabasePool:
    """The databases of one test process, each made from `template` (a migrated database no
    one connects to) and handed to one test at a time."""

    def __init__(self, server_dsn: str, template: str) -> None:
        self.server_dsn = server_dsn
        self.template = template
        self._free: list[str] = []
        self._all: set[str] = set()
        self._admin: asyncpg.Connection | None = None
        self._newest_oid = 0
        self._tables: list[str] = []
        self._catalog: dict[str, str | None] = {}
        self._fingerprint = ""

    async def _connection(self) -> asyncpg.Connection:
        if self._admin is None or self._admin.is_closed():
            self._admin = await asyncpg.connect(self.server_dsn)
        return self._admin

    async def create(self, name: str | None = None) -> str:
        name = name or f"{self.template}_{next(_NUMBERS)}"
        admin = await self._connection()
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self._all.add(name)
        return name

    async def drop(self, name: str) -> None:
        admin = await self._connection()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._all.discard(name)

    async def acquire(self) -> str:
        if self._free:
            return self._free.pop()
        name = await self.create()
        if not self._fingerprint:
            conn = await asyncpg.connect(with_database(self.server_dsn, name))
            try:
                self._newest_oid = await conn.fetchval(NEWEST_OID)
                self._tables = [
                    r["name"]
                    for r in await conn.fetch(ADDED, 0)
                    if r["kind"] == "TABLE" and r["name"].split(".")[1] != "migrations"
                ]
                self._catalog = dict(await conn.fetch(CATALOG))
                self._fingerprint = await conn.fetchval(FINGERPRINT)
            finally:
                await conn.close()
        return name

    async def release(self, name: str) -> str | None:
        """Reset `name` and put it back in the pool under a new name; when it cannot be made
        like new, drop it, put a new one in its place and say why.

        The new name keeps what an earlier test left running (the tests share one event loop:
        a pool, a worker or a waiter that outlived its test reconnects with its DSN) away from
        the next test's database: it finds no database by the old name."""
        try:
            await self.reset(name)
            renamed = f"{self.template}_{next(_NUMBERS)}"
            admin = await self._connection()
            await admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{renamed}"')
        except (NotFresh, asyncpg.PostgresError, OSError) as exc:
            await self.drop(name)
            self._free.append(await self.create())
            return f"{type(exc).__name__}: {exc}"
        self._all.discard(name)
        self._all.add(renamed)
        self._free.append(renamed)
        return None

    async def _end_sessions(self, name: str) -> None:
        admin = await self._connection()
        sessions = "FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()"
        # Counted after: a session that ended by itself meanwhile is no backend to terminate
        # (false, and a warning), not one that would not end.
        await admin.execute(f"SELECT pg_terminate_backend(pid, 10000) {sessions}", name)
        stuck = await admin.fetchval(f"SELECT count(*) {sessions}", name)
        if stuck:
            raise NotFresh(f"{stuck} sessions would not end")

    async def reset(self, name: str) -> None:
        await self._end_sessions(name)
        # before connecting: a test may have made the database's sessions read-only
        await (await self._connection()).execute(f'ALTER DATABASE "{name}" RESET ALL')
        conn = await asyncpg.connect(
            with_database(self.server_dsn, name), server_settings={"lock_timeout": "10s"}
        )
        try:
            counted = conn.get_server_version() >= (15, 0)
            changed = not counted or await conn.fetchval(CATALOG_WRITES) > 0
            if changed:
                added = sorted(
                    [(r["kind"], r["name"]) for r in await conn.fetch(ADDED, self._newest_oid)],
                    key=lambda o: _ORDER.index(o[0]) if o[0] in _ORDER else len(_ORDER),
                )
                for kind, obj in added:
                    await conn.execute(_drop(kind, obj))
            written = await conn.fetchrow(WRITTEN, self._tables)
            if written["deleted"]:
                async with conn.transaction():
                    await conn.execute("SET LOCAL session_replication_role = replica")
                    for table in written["deleted"]:
                        await conn.execute(f"DELETE FROM {table}")
            if written["truncated"]:
                await conn.execute(f"TRUNCATE {', '.join(written['truncated'])}")
            for sequence in written["sequences"]:
                await conn.execute(f"ALTER SEQUENCE {sequence} RESTART")
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
                await conn.execute(_PLANNER_STATISTICS)
            if counted:
                # this session's own counts (the reset's writes) handed in before the zeroing
                await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_reset()")
            if changed and await conn.fetchval(FINGERPRINT) != self._fingerprint:
                now = dict(await conn.fetch(CATALOG))
                differ = [k for k, v in self._catalog.items() if now.get(k) != v]
                raise NotFresh(f"its {', '.join(differ)} differ from the template's")
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if others:
                raise NotFresh(f"{others} sessions came back during the reset")
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def fresh(self) -> AsyncIterator[str]:
        """A database made from the template for one test, dropped after it."""
        name = await self.create(f"{self.template}_fresh_{next(_NUMBERS)}")
        try:
            yield name
        finally:
            await self.drop(name)

    async def close(self) -> None:
        for name in list(self._all):
            await self.drop(name)
        if self._admin is not None:
            await self._admin.close()
