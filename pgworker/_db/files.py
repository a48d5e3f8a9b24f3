"""The named SQL files, read once from the package.

`sql/` lives at the repository root, where readers look for it; `pgworker/sql` is a symbolic link
to it in the repository and the directory itself in a wheel (see pyproject.toml), so the same
`importlib.resources` lookup serves an editable install and an installed wheel.

Placeholders: `{schema}` becomes the quoted schema name, `{schema_literal}` the schema name as
a SQL string literal (a checked plain identifier: it holds no quote), `{jobs_channel}`,
`{cancel_channel}` and `{ended_channel}` the NOTIFY channels as SQL literals, `{job_columns}`
the columns of a `Job`, and `{name}` the fragment `_name.sql` (which may itself name fragments;
the comment at its top is left out where it is placed).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable

from .. import _validate as validate
from ..models import DEFAULT_SCHEMA, JOB_FIELDS, JSON_COLUMNS


def sql_dir() -> Traversable:
    return files("pgworker") / "sql"


def jobs_channel(schema: str) -> str:
    """The NOTIFY channel that announces new jobs; the payload is the queue."""
    return f"{schema}_jobs"


def cancel_channel(schema: str) -> str:
    """The NOTIFY channel that asks workers to cancel a running job; the payload is its id."""
    return f"{schema}_cancel"


def ended_channel(schema: str) -> str:
    """The NOTIFY channel that announces the end of an awaited job; the payload is its id."""
    return f"{schema}_ended"


def job_columns() -> str:
    """The select list of a `jobs` row aliased `j`, in the order of `Job`'s fields."""
    return ", ".join(
        f"j.{name}::text AS {name}" if name in JSON_COLUMNS else f"j.{name}" for name in JOB_FIELDS
    )


def _fill(text: str, fragments: dict[str, str]) -> str:
    """`text` with each `{name}` of a fragment replaced by it, and those its fragments name."""
    for _ in range(len(fragments) + 1):
        placed = [name for name in fragments if "{" + name + "}" in text]
        if not placed:
            return text
        for name in placed:
            text = text.replace("{" + name + "}", fragments[name])
    raise ValueError("the SQL fragments of sql/queries include each other in a cycle")


def _render(text: str, schema: str, fragments: dict[str, str]) -> str:
    validate.identifier("schema", schema)
    text = _fill(text, fragments)
    return (
        text.replace("{jobs_channel}", f"'{jobs_channel(schema)}'")
        .replace("{cancel_channel}", f"'{cancel_channel(schema)}'")
        .replace("{ended_channel}", f"'{ended_channel(schema)}'")
        .replace("{job_columns}", job_columns())
        .replace("{schema_literal}", f"'{schema}'")
        .replace("{schema}", f'"{schema}"')
    )


def _sql_files(folder: str) -> list[Traversable]:
    return sorted(
        (p for p in (sql_dir() / folder).iterdir() if p.name.endswith(".sql")),
        key=lambda p: p.name,
    )


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def _placed(fragment: str) -> str:
    """A fragment as it is placed: without the comment at its top, which tells the reader of its
    file what it holds (the statement that places it says why)."""
    lines = fragment.strip().splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()


@cache
def queries(schema: str) -> dict[str, str]:
    """Every query of `sql/queries`, keyed by file stem, rendered for `schema`."""
    found = {p.name.removesuffix(".sql"): p.read_text() for p in _sql_files("queries")}
    fragments = {k[1:]: _placed(v) for k, v in found.items() if k.startswith("_")}
    return {k: _render(v, schema, fragments) for k, v in found.items() if not k.startswith("_")}


@cache
def migrations(schema: str) -> tuple[Migration, ...]:
    """The numbered migrations of `sql/migrations`, in order."""
    found = []
    for p in _sql_files("migrations"):
        number, _, name = p.name.removesuffix(".sql").partition("_")
        found.append(Migration(int(number), name, _render(p.read_text(), schema, {})))
    return tuple(found)


def latest_version() -> int:
    return migrations(DEFAULT_SCHEMA)[-1].version
