"""`make schema` (`python -m tests.schema_dump > sql/schema.sql`): the schema the migrations of
sql/migrations make, as `pg_dump --schema-only` prints it, for sql/schema.sql.

The migrations stay the source of truth (each applied once, never edited); sql/schema.sql is
what they add up to, in one file a reader can take in. tests/test_schema_file.py dumps a fresh
database the same way and fails when the file differs, saying to run this.

The server is PGWORKER_TEST_DSN's (or the first argument); the pg_dump is the one of its major
(pg_dump's text differs between majors), found on PATH or under /usr/lib/postgresql/<major>/bin.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

import pgworker

SCHEMA = "pgworker"

HEADER = """\
-- The pgworker schema as the migrations of sql/migrations make it: `pg_dump --schema-only
-- --schema=pgworker --no-owner` of a database migrated from scratch, by the pg_dump of the
-- server's major (PostgreSQL {major}). A file to read, not to run: `pgworker migrate` applies the
-- migrations. Regenerate it with `make schema` (python -m tests.schema_dump > sql/schema.sql);
-- tests/test_schema_file.py fails when it differs from what the migrations make.
--
-- Left out of pg_dump's text, as they vary between runs and versions: its header comments (the
-- versions dumped from and by), the \\restrict and \\unrestrict lines of newer pg_dumps, the SET
-- and set_config lines that prepare a restore, and runs of blank lines.
"""

_DROPPED = re.compile(
    r"^(-- Dumped (from database|by pg_dump) version .*"
    r"|\\(un)?restrict .*"
    r"|SET .*"
    r"|SELECT pg_catalog\.set_config\('search_path', '', false\);)$"
)


def with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def server_major(version_num: int) -> int:
    return version_num // 10000


def pg_dump_binary(major: int) -> str | None:
    """The pg_dump of PostgreSQL `major`, or None when this machine has none."""
    candidates = [shutil.which("pg_dump"), f"/usr/lib/postgresql/{major}/bin/pg_dump"]
    for path in candidates:
        if not path or not Path(path).exists():
            continue
        out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
        found = re.search(r"\s(\d+)(\.\d+)*", out.stdout)
        if found and int(found.group(1)) == major:
            return path
    return None


def normalised(dump: str, major: int) -> str:
    """pg_dump's text without what varies between runs and versions (see HEADER)."""
    kept = [line for line in dump.splitlines() if not _DROPPED.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip("\n")
    return HEADER.format(major=major) + "\n" + text + "\n"


async def dump(server_dsn: str) -> tuple[str | None, int]:
    """The schema of a database migrated from scratch on `server_dsn`'s server, normalised, and
    the server's major; None for the text when no pg_dump of that major is found."""
    name = f"pgworker_schema_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        major = server_major(int(await admin.fetchval("SHOW server_version_num")))
        binary = pg_dump_binary(major)
        if binary is None:
            return None, major
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = with_database(server_dsn, name)
            conn = await asyncpg.connect(dsn)
            try:
                await pgworker.migrate(conn, schema=SCHEMA)
            finally:
                await conn.close()
            out = await asyncio.to_thread(
                subprocess.run,
                [binary, "--schema-only", f"--schema={SCHEMA}", "--no-owner", "--dbname", dsn],
                capture_output=True,
                text=True,
                check=True,
            )
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
    return normalised(out.stdout, major), major


def main() -> int:
    server_dsn = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PGWORKER_TEST_DSN")
    if not server_dsn:
        print("give the server's DSN as an argument or in PGWORKER_TEST_DSN", file=sys.stderr)
        return 2
    text, major = asyncio.run(dump(server_dsn))
    if text is None:
        print(f"no pg_dump of PostgreSQL {major} on this machine", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
