"""Each option declared once: the enqueue options (pgworker.models.EnqueueOptions) and the worker
settings (pgworker.settings.Settings) are what every surface offers, name for name, type for
type, default for default. A surface that differs fails here, unless listed below with the
reason it legitimately differs."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
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
from pgworker.settings import SETTINGS, Settings, WorkerOptions, variable
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


def test_sync_enqueue_many_takes_the_arguments_of_its_asynchronous_namesake() -> None:
    asynchronous = inspect.signature(pgworker.enqueue_many).parameters
    synchronous = inspect.signature(sync.enqueue_many).parameters
    assert [(p.name, p.kind, p.default) for p in synchronous.values()] == [
        (p.name, p.kind, p.default) for p in asynchronous.values()
    ]


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


# --- worker settings ---------------------------------------------------------------------

RUN_ONLY = {
    "target": "what to serve, not how: the module holding the registry",
    "log_format": "logging is the process's, configured before the worker exists "
    "(configure_logging), not a setting of the worker",
    "log_level": "as log_format",
}
"""The options of `pgworker run` that are not worker settings, each with its reason."""

WORKER_NAMES = {
    "dsn": "a positional argument of Worker(registry, dsn), None: PGWORKER_DSN or DATABASE_URL",
    "concurrency": "named in Worker's signature, the option most often given",
    "queues": "named in Worker's signature: None serves the registry's queues, which only the "
    "Worker knows",
}
"""The settings Worker(...) names in its signature rather than in WorkerOptions, with why."""


def _run_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = commands.choices["run"]
    return found


def test_every_setting_is_declared_with_how_it_is_given() -> None:
    assert list(SETTINGS) == [f.name for f in dataclasses.fields(Settings)]
    for name, setting in SETTINGS.items():
        assert setting.help and setting.default, name
        assert (setting.flag is None) == bool(setting.why), name  # no flag: said why


def test_worker_takes_every_setting_as_a_keyword() -> None:
    parameters = inspect.signature(pgworker.Worker).parameters
    assert [p for p in parameters if p in SETTINGS] == list(WORKER_NAMES)
    assert parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    assert _hints(pgworker.Worker.__init__)["options"] == typing.Unpack[WorkerOptions]
    hints, declared = typing.get_type_hints(WorkerOptions), _hints(Settings)
    assert list(hints) == [n for n in SETTINGS if n not in WORKER_NAMES]
    for name, hint in hints.items():
        assert hint == declared[name], name


def test_pgworker_run_has_a_flag_for_every_setting() -> None:
    parser = _run_parser()
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    flagged = [n for n, s in SETTINGS.items() if s.flag is not None]
    assert set(actions) == {*flagged, *RUN_ONLY}
    for name in flagged:
        flag = SETTINGS[name].flag or "--" + name.replace("_", "-")
        assert actions[name].option_strings == [flag], name
        assert f"${variable(name)}" in (actions[name].help or ""), name


_TEXTS = {
    "int": "7",
    "seconds": "2.5",
    "text": "given1",
    "url": "postgresql://a@b/c",
    "names": "a,b",
    "keys": "k1,k2",
    "retention": "2d",
}


def test_every_setting_is_read_from_its_variable() -> None:
    env = {}
    for name, setting in SETTINGS.items():
        default = getattr(Settings(dsn="postgresql://x@y/z"), name)
        env[variable(name)] = str(not default).lower() if setting.kind == "flag" else None
        env[variable(name)] = env[variable(name)] or _TEXTS[setting.kind]
    read = Settings.from_env({k: v for k, v in env.items() if v is not None})
    expected = Settings(
        dsn="postgresql://a@b/c",
        concurrency=7,
        queues=("a", "b"),
        worker_id="given1",
        poll_interval=2.5,
        shutdown_timeout=2.5,
        lease=2.5,
        listen=False,
        durable_claims=True,
        schema="given1",
        code_version="given1",
        retain_completed=2 * 86400.0,
        retain_failed=2 * 86400.0,
        redact_keys=("k1", "k2"),
        health_file="given1",
        metrics_port=7,
        metrics_host="given1",
        pooler=True,
        listen_dsn="postgresql://a@b/c",
    )
    assert read == expected


def test_the_guide_lists_every_setting() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "guide" / "workers.md").read_text()
    table = guide.split("## Settings", 1)[1].split("\n\n", 2)[1]
    for name, setting in SETTINGS.items():
        assert variable(name) in table, name
        if setting.flag is not None:
            assert f"`{setting.flag or '--' + name.replace('_', '-')}" in table, name


NOT_SETTINGS = {
    "PGWORKER_API_TOKEN": "pgworker serve's, not a worker's (docs/http-api.md)",
    "PGWORKER_TOKENS": "pgworker serve's, not a worker's",
    "PGWORKER_LOG_FORMAT": "the process's logging (RUN_ONLY's log_format), for every command",
    "PGWORKER_LOG_LEVEL": "the process's logging, as PGWORKER_LOG_FORMAT",
    "PGWORKER_BULK_BATCH": "the batch of a bulk action, run by the CLI, a console or the leader",
    "PGWORKER_BULK_LEASE": "how long a runner of bulk actions (a console, serve, the CLI, the "
    "maintenance leader) holds one past its last batch, read by each runner (_bulk.py)",
    "PGWORKER_MAX_PAYLOAD_BYTES": "a bound of what is accepted, for every path and process, read "
    "once at import (_validate.py), not per worker",
    "PGWORKER_TEST_DSN": "the pytest plugin's server (pgworker.testing)",
}
"""The PGWORKER_* variables that are not worker settings, each with its reason."""


def test_every_pgworker_variable_is_a_setting_or_listed() -> None:
    package = Path(pgworker.__file__).parent
    named = set()
    for path in package.rglob("*.py"):
        named |= set(re.findall(r"PGWORKER_[A-Z_]*[A-Z]", path.read_text()))
    settings = {variable(name) for name in SETTINGS}
    assert named - settings == set(NOT_SETTINGS)
