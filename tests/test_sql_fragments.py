"""The named statements' shared fragments (`sql/queries/_name.sql`, placed as `{name}`): each is
used, none is left unplaced, and the comments say why rather than point at an issue number."""

from __future__ import annotations

import re

import pytest

from pgworker._db import files

from .helpers import ROOT

QUERIES = ROOT / "sql" / "queries"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_FILLED_LATER = {
    # pooled_function.sql is the template of a CREATE FUNCTION (Queries.pooled_function);
    # the testing database statements take their database's name (queries._with_database).
    "pooled_function": {"columns", "body", "function", "statement", "timeout", "parameters"},
    "testing_database_create": {"database"},
    "testing_database_drop": {"database"},
    # a function's quoted signature, read off the catalog (pooled_functions_unused.sql).
    "pooled_function_drop": {"signature"},
}


def test_every_fragment_is_placed_somewhere() -> None:
    texts = {p.name: p.read_text() for p in QUERIES.glob("*.sql")}
    for fragment in (name for name in texts if name.startswith("_")):
        placeholder = "{" + fragment.removeprefix("_").removesuffix(".sql") + "}"
        users = [name for name, text in texts.items() if placeholder in text]
        assert users, f"{fragment} is placed by no statement"


def test_no_placeholder_is_left_in_a_rendered_statement() -> None:
    for name, sql in files.queries("pgworker").items():
        assert set(_PLACEHOLDER.findall(sql)) == _FILLED_LATER.get(name, set()), name


def test_a_fragment_is_placed_without_the_comment_at_its_top() -> None:
    assert files._placed("-- what it holds\n-- and why\nSELECT 1 -- kept\n  , 2\n") == (
        "SELECT 1 -- kept\n  , 2"
    )
    for sql in files.queries("pgworker").values():
        assert "What belongs to the jobs that CTE `gone`" not in sql


def test_a_fragment_placed_in_a_fragment_is_filled_and_a_cycle_is_refused() -> None:
    assert files._fill("SELECT {a}", {"a": "{b} + 1", "b": "2"}) == "SELECT 2 + 1"
    with pytest.raises(ValueError, match="cycle"):
        files._fill("SELECT {a}", {"a": "{b}", "b": "{a}"})


def test_the_statements_and_the_database_code_name_no_issue_numbers() -> None:
    sources = [*QUERIES.glob("*.sql"), *(ROOT / "pgworker" / "_db").glob("*.py")]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sources
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissues? \d+", line, re.IGNORECASE)
    ]
    assert not found, f"say why instead of naming an issue: {found}"
