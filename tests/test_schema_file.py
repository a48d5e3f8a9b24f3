"""sql/schema.sql shows the schema the migrations make, in one file: it is kept equal to a fresh
database's `pg_dump --schema-only` (tests/schema_dump.py), and is neither a migration nor a
query to the loader."""

from __future__ import annotations

import difflib
import re

import pytest

from pgworker._db import files

from .helpers import ROOT
from .schema_dump import dump

SCHEMA_FILE = ROOT / "sql" / "schema.sql"
REGENERATE = "make schema (python -m tests.schema_dump > sql/schema.sql)"


@pytest.mark.asyncio(loop_scope="session")
async def test_the_schema_file_is_what_the_migrations_make(server_dsn: str) -> None:
    made, major = await dump(server_dsn)
    if made is None:
        pytest.skip(f"no pg_dump of PostgreSQL {major} on this machine (PATH, /usr/lib/postgresql)")
    kept = SCHEMA_FILE.read_text()
    recorded = re.search(r"\(PostgreSQL (\d+)\)", kept)
    assert recorded, f"sql/schema.sql has lost its header; run {REGENERATE}"
    if int(recorded.group(1)) != major:
        pytest.skip(
            f"sql/schema.sql is pg_dump's text of PostgreSQL {recorded.group(1)}, this server is "
            f"{major}: the text differs between majors"
        )
    if made != kept:
        diff = "".join(
            list(
                difflib.unified_diff(
                    kept.splitlines(keepends=True),
                    made.splitlines(keepends=True),
                    "sql/schema.sql",
                    "the migrations",
                )
            )[:80]
        )
        pytest.fail(
            f"sql/schema.sql differs from the schema the migrations make; run {REGENERATE} and "
            f"commit it with the migration:\n{diff}",
            pytrace=False,
        )


def test_the_schema_file_is_neither_a_migration_nor_a_query() -> None:
    assert SCHEMA_FILE.exists()
    assert "schema" not in files.queries("pgworker")
    migrations = files.migrations("pgworker")
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
    assert "schema" not in {m.name for m in migrations}
    assert not any("pg_dump" in m.sql for m in migrations)
