"""The named SQL files, loaded once.

The files live in `sql/` at the repository root; a wheel carries them as `pgworker/sql`.
`{schema}` is the only identifier substituted, always as a quoted identifier; `{name}` includes
the fragment `_name.sql` (shared column lists and CTEs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def sql_dir() -> Path:
    packaged = Path(__file__).parent / "sql"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "sql"


def quote_schema(schema: str) -> str:
    if not _SCHEMA_NAME.match(schema):
        raise ValueError(f"schema {schema!r} must be a plain SQL identifier (letters, digits, _)")
    return f'"{schema}"'


def _render(text: str, schema: str, fragments: dict[str, str]) -> str:
    for name, fragment in fragments.items():
        text = text.replace("{" + name + "}", fragment)
    return text.replace("{schema}", quote_schema(schema))


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


@cache
def queries(schema: str) -> dict[str, str]:
    """Every query of `sql/queries`, keyed by file stem, rendered for `schema`."""
    folder = sql_dir() / "queries"
    fragments = {p.stem[1:]: p.read_text().strip() for p in sorted(folder.glob("_*.sql"))}
    return {
        p.stem: _render(p.read_text(), schema, fragments)
        for p in sorted(folder.glob("*.sql"))
        if not p.stem.startswith("_")
    }


@cache
def migrations(schema: str) -> tuple[Migration, ...]:
    """The numbered migrations of `sql/migrations`, in order."""
    found = []
    for p in sorted((sql_dir() / "migrations").glob("*.sql")):
        number, _, name = p.stem.partition("_")
        found.append(Migration(int(number), name, _render(p.read_text(), schema, {})))
    return tuple(found)


def latest_version() -> int:
    return migrations("pgworker")[-1].version
