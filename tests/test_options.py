"""Each option declared once: the enqueue options (pgworker.models.EnqueueOptions) and the worker
settings (pgworker.settings.Settings) are what every surface offers, name for name, type for
type, default for default. A surface that differs fails here, unless listed below with the
reason it legitimately differs."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import typing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import sync
from pgworker._web.app import create_app
from pgworker._web.config import WebConfig
from pgworker.cli import build_parser
from pgworker.cli._jobs import NOT_FLAGS
from pgworker.enqueue import _Fields
from pgworker.models import ENQUEUE_OPTIONS, EnqueueOptions, JobSpec
from pgworker.registry import Registry, TaskHandle
from pgworker.testing import RunJobOptions, run_job

OPTIONS = list(ENQUEUE_OPTIONS)
JOB = ["type", "payload"]
"""What an enqueue is of: the job's type and payload, given beside the options everywhere."""

SQL_LACKS = {
    "after": "a job with parents locks them and may retry on a deadlock (enqueue.py's "
    "_insert_after): the SQL function, callable inside any statement, does not take parents",
    "on_parent_failure": "means something only with after, which the SQL function does not take",
}
"""The options the SQL function `enqueue()` has no argument for, each with its reason."""


def _hints(fn: Any) -> dict[str, Any]:
    return typing.get_type_hints(fn)


DECLARED = typing.get_type_hints(EnqueueOptions)


def _keywords(fn: Any) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]


@pytest.mark.parametrize("fn", [pgworker.enqueue, sync.enqueue], ids=["enqueue", "sync.enqueue"])
def test_enqueue_and_sync_enqueue_take_the_declared_options(fn: Any) -> None:
    signature = inspect.signature(fn)
    assert _keywords(fn) == [*OPTIONS, "schema"]
    hints = _hints(fn)
    for name, option in ENQUEUE_OPTIONS.items():
        assert signature.parameters[name].default == option.default, name
        assert hints[name] == DECLARED[name], name


def test_sync_enqueue_takes_exactly_the_arguments_of_its_asynchronous_namesake() -> None:
    asynchronous = inspect.signature(pgworker.enqueue)
    synchronous = inspect.signature(sync.enqueue)
    assert list(synchronous.parameters) == list(asynchronous.parameters)
    for name, parameter in asynchronous.parameters.items():
        twin = synchronous.parameters[name]
        assert (twin.kind, twin.default) == (parameter.kind, parameter.default), name
    sync_hints, async_hints = _hints(sync.enqueue), _hints(pgworker.enqueue)
    for name in asynchronous.parameters:
        if name != "conn":  # a synchronous connection, not an asyncpg one
            assert sync_hints[name] == async_hints[name], name


def test_jobspec_and_the_validated_fields_hold_the_declared_options() -> None:
    fields = dataclasses.fields(JobSpec)
    assert [f.name for f in fields] == [*JOB, *OPTIONS]
    hints = _hints(JobSpec)
    for f in fields[len(JOB) :]:
        assert f.default == ENQUEUE_OPTIONS[f.name].default, f.name
        assert hints[f.name] == DECLARED[f.name], f.name
    assert list(_Fields._fields) == ["type", *OPTIONS]


def _handle() -> tuple[Registry, TaskHandle[Any, Any]]:
    registry = Registry()

    @registry.task("options")
    async def handler(ctx: Any, payload: Any) -> None:
        return None

    return registry, handler


@pytest.mark.parametrize(
    "fn",
    [TaskHandle.enqueue, TaskHandle.enqueue_many, TaskHandle.spec, Registry.enqueue],
    ids=["handle.enqueue", "handle.enqueue_many", "handle.spec", "Registry.enqueue"],
)
def test_task_handles_take_the_declared_options(fn: Any) -> None:
    options = inspect.signature(fn).parameters["options"]
    assert options.kind is options.VAR_KEYWORD
    assert _hints(fn)["options"] == typing.Unpack[EnqueueOptions]


def test_a_handle_passes_every_declared_option_on() -> None:
    _, handle = _handle()
    given = {
        "queue": "q",
        "priority": 3,
        "max_retries": 2,
        "idempotency_key": "k",
        "correlation_id": "c",
        "run_at": datetime(2030, 1, 1, tzinfo=UTC),
        "delay": 5,
        "version": 1,
        "concurrency_key": "ck",
        "after": [1],
        "on_parent_failure": "run",
        "unique_key": "u",
        "unique_states": ["pending", "running"],
        "unique_period": 60,
        "replace": True,
    }
    assert set(given) == set(OPTIONS)  # a new option is added here too
    spec = handle.spec({}, **given)  # type: ignore[arg-type]
    assert {name: getattr(spec, name) for name in OPTIONS} == given


def test_run_job_takes_the_declared_options_and_makes_the_job_of_them() -> None:
    assert set(OPTIONS) <= set(RunJobOptions.__annotations__)
    hints = typing.get_type_hints(RunJobOptions)
    for name in OPTIONS:
        assert hints[name] == DECLARED[name], name
    assert _hints(run_job)["options"] == typing.Unpack[RunJobOptions]

    registry = Registry()
    seen: list[Any] = []

    @registry.task("look", queue="mail", priority=5)
    async def look(ctx: Any, payload: Any) -> None:
        seen.append(ctx.job)

    run = run_job(registry, "look", {}, concurrency_key="k", after=[4, 2])
    assert run.status == "completed"
    job = seen[-1]
    assert (job.queue, job.priority, job.concurrency_key) == ("mail", 5, "k")
    assert (job.parents, job.parents_left) == ((2, 4), 0)
    run_job(registry, "look", {}, queue="other", priority="high", unique_key="u")
    assert (seen[-1].queue, seen[-1].priority, seen[-1].unique_key) == ("other", 20, "u")
    run_job(registry, "look", {}, idempotency_key="i", version=1, max_retries=7)
    assert (seen[-1].idempotency_key, seen[-1].version, seen[-1].max_retries) == ("i", 1, 7)
    with pytest.raises(pgworker.ValidationError) as refused:
        run_job(registry, "look", {}, unique_period=5)
    assert refused.value.field == "unique_period"


def _enqueue_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices["enqueue"]
    return found


def test_the_cli_flags_are_the_declared_options() -> None:
    parser = _enqueue_parser()
    given = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    common = {"dsn", "schema", "pooler"}
    assert given == {"payload", *common, *(n for n in OPTIONS if n not in NOT_FLAGS)}
    assert set(NOT_FLAGS) <= set(OPTIONS) and all(NOT_FLAGS.values())
    for action in parser._actions:
        if action.dest in ENQUEUE_OPTIONS:
            assert action.option_strings == ["--" + action.dest.replace("_", "-")]
            assert action.help and action.help.endswith(")"), action.dest  # its default said
            assert "`" not in action.help, action.dest  # the options it names written as flags


def test_the_http_body_has_the_declared_options() -> None:
    document = create_app(WebConfig("postgresql://u@h/d", tokens=("t" * 20,))).openapi()
    body = document["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    reference = body["schema"]["$ref"].rsplit("/", 1)[1]
    properties = document["components"]["schemas"][reference]["properties"]
    assert list(properties) == [*JOB, *OPTIONS]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_sql_function_has_the_declared_options(conn: asyncpg.Connection) -> None:
    names = await conn.fetchval(
        "SELECT proargnames[1:pronargs] FROM pg_proc "
        "WHERE proname = 'enqueue' AND pronamespace = 'pgworker'::regnamespace"
    )
    assert names == [*JOB, *(n for n in OPTIONS if n not in SQL_LACKS)]
    assert set(SQL_LACKS) <= set(OPTIONS) and all(SQL_LACKS.values())


def test_the_guide_lists_every_option() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "guide" / "enqueue.md").read_text()
    example = guide.split("## From Python", 1)[1].split("```", 2)[1]
    for name in OPTIONS:
        assert f"    {name}=" in example, name
