"""Sentences of the documentation (once the README's) that a newcomer following it found false
once, each kept by a test: the columns of `pgworker.jobs` and of a job in an HTTP answer, the
dashboard's Content-Security-Policy, which commands take --dsn, and the exit status of
`pgworker health`'s own usage mistakes."""

from __future__ import annotations

import argparse
import re
from typing import Any

import httpx
import pytest

from pgworker import cli as cli_module

from .docs import page
from .docs import paragraph as paragraph_of
from .webserver import Served, server, serving

on_the_loop = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name

STATES = page("operations/states.md")
HTTP_API = page("http-api.md")
DASHBOARD = page("operations/dashboard.md")
CLI = page("cli.md")
CONTAINERS = page("operations/containers.md")


async def jobs_columns(conn: Any) -> set[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns"
        " WHERE table_schema = 'pgworker' AND table_name = 'jobs'"
    )
    return {r["column_name"] for r in rows}


@on_the_loop
async def test_the_tables_section_lists_every_column_of_jobs(conn):
    listed = set(re.findall(r"`([a-z_]+)`", paragraph_of(STATES, "`pgworker.jobs`: ")))
    listed.discard("max_elapsed")  # named in `budget_started_at`'s explanation, not a column
    assert listed == await jobs_columns(conn)


@on_the_loop
async def test_a_job_in_an_answer_has_the_columns_the_docs_say(server: Served, conn):
    said = paragraph_of(HTTP_API, "**Jobs in answers.**")
    but = re.search(r"every column but ((?:`\w+`, )*`\w+` and `\w+`)", said)
    assert but is not None, said
    expected = await jobs_columns(conn) - set(re.findall(r"`(\w+)`", but[1]))
    async with server.client() as client:
        created = await client.post("/jobs", json={"type": "readme-keys", "payload": {"a": 1}})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        read = await client.get(f"/jobs/{job_id}")
        listed = await client.get("/jobs", params={"type": "readme-keys"})
    assert set(created.json()) == expected
    assert set(read.json()) == expected | {"attempt_history", "milestones", "steps"}
    assert [set(j) for j in listed.json()["jobs"]] == [expected]


@on_the_loop
async def test_the_dashboard_sends_the_content_security_policy_the_docs_quote(dsn):
    hostile = paragraph_of(DASHBOARD, "**Hostile content.**")
    quoted = re.search(r"`Content-Security-Policy: ([^`]+)`", hostile)
    assert quoted is not None
    async with (
        serving(dsn, "--insecure-no-auth", token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        page = await client.get("/")
    assert page.status_code == 200, page.text
    assert page.headers["content-security-policy"] == quoted[1]
    assert page.headers["x-frame-options"] == "DENY"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by name, `failed list` under its own name."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in subcommands(sub).items()})
    return found


def test_the_top_level_help_names_the_only_commands_without_dsn():
    parser = cli_module.build_parser()
    without = {
        name
        for name, sub in subcommands(parser).items()
        if not sub._subparsers and "--dsn" not in sub._option_string_actions
    }
    assert without == {"health"}
    description = " ".join((parser.description or "").split())
    assert "Every command but health takes --dsn" in description
    said = "Every subcommand but `health` ([Health check](operations/containers.md#health-check))"
    assert f"{said} takes `--dsn`" in " ".join(CLI.split())


@pytest.mark.parametrize("argv", [["health"], ["health", "--no-such-option"]])
def test_a_mistake_in_the_health_probe_command_line_exits_2(argv, monkeypatch, capsys):
    """docs/operations/containers.md, Health check: the probe's own usage mistakes exit 2; an
    unhealthy worker 1."""
    assert "exits 2, as for every command: fix the probe" in " ".join(CONTAINERS.split())
    monkeypatch.delenv("PGWORKER_HEALTH_FILE", raising=False)
    try:
        code = cli_module.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert capsys.readouterr().err.count("\n") == 1


@on_the_loop
@pytest.mark.parametrize(
    ("priority", "says"),
    [
        ("urgent", "priority: unknown label; use an int or one of low, medium, high, critical"),
        (2**40, "priority: must be an int from -2147483648 to 2147483647"),
        (True, "priority: must be an int or a label (low, medium, high, critical)"),
    ],
)
async def test_a_bad_priority_over_http_says_an_int_or_a_label(server: Served, priority, says):
    """docs/http-api.md: `priority` is an int or a label; a 422 names the field and says what is
    allowed (not "should be a valid integer" for a label), never echoing what was sent."""
    async with server.client() as client:
        answer = await client.post("/jobs", json={"type": "t", "payload": {}, "priority": priority})
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == "priority"
    assert answer.json()["error"].startswith(says), answer.json()
    assert "valid integer" not in answer.json()["error"]
