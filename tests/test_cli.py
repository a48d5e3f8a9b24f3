"""The real CLI in subprocesses: migrate, run, enqueue, status, signals, logs, user errors; the
help of every option; the status rendering (pgworker/cli/_render.py) as pure functions."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import pgworker
from pgworker import cli as cli_module
from pgworker._db import files
from pgworker.cli import _render

from .helpers import (
    ROOT,
    all_finished,
    attempts,
    cli,
    cli_process,
    database_of,
    spawn_worker,
    wait_for,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def start_worker(dsn: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    return spawn_worker("tests.apps.basic", dsn, log, *args)


def json_lines(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


async def test_migrate_twice_at_once_is_safe(empty_dsn, conn):
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgworker", "migrate", "--dsn", empty_dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(),
            cwd=ROOT,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    versions = [m.version for m in files.migrations("pgworker")]
    assert sorted(o[0].decode().strip() for o in outs) == [
        f"applied migrations {versions}",
        "schema is up to date",
    ]
    again = cli("migrate", "--dsn", empty_dsn)
    assert again.returncode == 0 and "up to date" in again.stdout


async def test_run_serves_a_module_and_status_reports_counts(dsn, conn, tmp_path):
    out = cli(
        "enqueue",
        "echo",
        "--payload",
        '{"hello": "world"}',
        "--correlation-id",
        "req-9",
        "--dsn",
        dsn,
    )
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["id"]
    assert cli("enqueue", "fail", "--dsn", dsn).returncode == 0
    assert cli("enqueue", "nobody-serves", "--queue", "q2", "--dsn", dsn).returncode == 0
    log = tmp_path / "worker.log"
    worker = start_worker(
        dsn,
        log,
        "--log-format",
        "json",
        "--worker-id",
        "cli-w1",
        "--queue",
        "default",
        "--queue",
        "q2",
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 2 FROM pgworker.jobs WHERE status IN ('completed', 'failed')"
            ),
            timeout=30,
        )
        status = cli("status", "--dsn", dsn)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].split() == [
            "queue",
            "pending",
            "running",
            "completed",
            "failed",
            "cancelled",
            "oldest",
            "pending",
        ]
        assert lines[1].split()[:6] == ["default", "0", "0", "1", "1", "0"]
        assert lines[2].split()[:6] == ["q2", "1", "0", "0", "0", "0"]
        assert "live workers: 1" in status.stdout and "cli-w1" in status.stdout
        assert "q2: nobody-serves" in status.stdout
        data = json.loads(cli("status", "--json", "--dsn", dsn).stdout)
        assert data["queues"]["default"]["completed"] == 1
        assert data["unserved"] == [{"queue": "q2", "type": "nobody-serves"}]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    job = await pgworker.get_job(conn, job_id)
    assert job.result == {"hello": "world"}
    assert job.worker_id == "cli-w1"
    lines = json_lines(log)
    mine = [x for x in lines if x.get("job_id") == job_id]
    events = {x["event"] for x in mine}
    assert {"echoing", "app line inside a job", "job completed"} <= events
    for x in mine:
        assert (x["attempt"], x["correlation_id"], x["worker_id"]) == (1, "req-9", "cli-w1")
        assert {"level", "timestamp"} <= x.keys()
    assert any(x["event"] == "worker stopped" for x in lines)


async def test_sigterm_with_jobs_running_leaves_nothing_running(dsn, conn, tmp_path):
    long = [(await pgworker.enqueue(conn, "sleep", {"seconds": 60})).job.id for _ in range(3)]
    short = [(await pgworker.enqueue(conn, "sleep", {"seconds": 0.3})).job.id for _ in range(2)]
    log = tmp_path / "worker.log"
    worker = start_worker(dsn, log, "--shutdown-timeout", "1", "--log-format", "json")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 5 FROM pgworker.jobs WHERE status = 'running'"
            ),
            timeout=30,
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'running'") == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts WHERE outcome = 'running'")
        == 0
    )
    for job_id in short:
        assert (await pgworker.get_job(conn, job_id)).status == "completed"
    for job_id in long:
        job = await pgworker.get_job(conn, job_id)
        assert (job.status, job.retry_count) == ("pending", 0)
        assert [a["outcome"] for a in await attempts(conn, job_id)] == ["interrupted"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("status",), "PGWORKER_DSN"),
        (("status", "--dsn", "postgresql://nobody@127.0.0.1:1/none"), "cannot reach the database"),
        (
            ("enqueue", "t", "--payload", "{oops", "--dsn", "postgresql://x@127.0.0.1:1/x"),
            "--payload is not valid JSON",
        ),
        (
            ("run", "no_such_module_here", "--dsn", "postgresql://x@127.0.0.1:1/x"),
            "cannot import 'no_such_module_here'",
        ),
        (
            ("enqueue", "t", "--run-at", "2030-01-01T00:00:00", "--dsn", "postgresql://x@h:1/x"),
            "--run-at: '2030-01-01T00:00:00' has no time zone; add one, e.g. "
            "2030-01-01T00:00:00+00:00",
        ),
        (
            ("enqueue", "t", "--run-at", "2030-01-01T00:00:00Z", "--delay", "3", "--dsn", "x://"),
            "--run-at: give --run-at or --delay, not both",
        ),
    ],
)
async def test_user_errors_are_one_line_and_exit_2(args, message):
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


async def test_enqueue_validation_error_names_the_field(dsn):
    out = cli("enqueue", "t", "--priority", "urgent", "--dsn", dsn)
    assert out.returncode == 2 and "priority: unknown label 'urgent'" in out.stderr
    out = cli("status", "--dsn", dsn)
    assert out.returncode == 0 and "(no jobs)" in out.stdout


async def test_run_refuses_an_unmigrated_database(empty_dsn):
    out = cli_process("run", "tests.apps.basic", "--dsn", empty_dsn)
    assert out.returncode == 2
    assert "run `pgworker migrate`" in out.stderr
    out = cli_process("run", "tests.apps.basic", "--dsn", empty_dsn, "--schema", "elsewhere")
    assert out.returncode == 2
    assert "run `pgworker migrate --schema elsewhere`" in out.stderr


async def test_a_log_variable_with_a_bad_value_is_an_error_naming_it(dsn):
    out = cli_process(
        "run", "tests.apps.basic", "--dsn", dsn, env={"PGWORKER_LOG_FORMAT": "xml"}, timeout=60
    )
    assert out.returncode == 2
    assert "PGWORKER_LOG_FORMAT: must be one of json, console, got 'xml'" in out.stderr


async def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()


async def test_cancel_a_pending_a_running_and_a_finished_job(dsn, conn, tmp_path):
    pending = (await pgworker.enqueue(conn, "echo", {}, delay=3600)).job.id
    running = (await pgworker.enqueue(conn, "sleep", {"seconds": 60})).job.id
    log = tmp_path / "worker.log"
    worker = start_worker(dsn, log, "--log-format", "json")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pgworker.jobs WHERE status = 'running'"
            ),
            timeout=30,
        )
        out = cli("cancel", str(running), "--dsn", dsn)
        assert (out.returncode, out.stdout) == (
            0,
            f"job {running} is running: its worker was asked to stop it\n",
        ), out.stderr
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'cancelled' FROM pgworker.jobs WHERE id = $1", running
            ),
            timeout=30,
        )
        assert [a["outcome"] for a in await attempts(conn, running)] == ["cancelled"]
    finally:
        await stop(worker)
    out = cli("cancel", str(pending), "--dsn", dsn)
    assert out.stdout == f"job {pending} cancelled (it was pending)\n", out.stderr
    assert (await pgworker.get_job(conn, pending)).status == "cancelled"
    out = cli("cancel", str(pending), "--dsn", dsn)
    assert out.stdout == f"job {pending} is already cancelled: nothing to cancel\n"
    missing = cli("cancel", str(running + 1000), "--dsn", dsn)
    assert missing.returncode == 2 and f"there is no job {running + 1000}" in missing.stderr
    for flag in ("--reason", "--by"):  # kept by a bulk cancel only: never silently dropped
        refused = cli("cancel", str(pending), flag, "x", "--dsn", dsn)
        assert refused.returncode == 2 and f"{flag}: goes with --filter" in refused.stderr


async def test_enqueue_run_at_is_stored(dsn, conn):
    out = cli("enqueue", "echo", "--run-at", "2030-01-02T09:30:00+02:00", "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    job = await pgworker.get_job(conn, json.loads(out.stdout)["id"])
    assert job.run_at == datetime(2030, 1, 2, 7, 30, tzinfo=UTC)
    assert job.status == "pending"
    naive = cli("enqueue", "echo", "--run-at", "2030-01-02T09:30:00", "--dsn", dsn)
    assert naive.returncode == 2
    assert "--run-at: '2030-01-02T09:30:00' has no time zone" in naive.stderr
    both = cli("enqueue", "echo", "--run-at", "2030-01-02T09:30:00Z", "--delay", "5", "--dsn", dsn)
    assert both.returncode == 2 and "--run-at: give --run-at or --delay, not both" in both.stderr
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1


async def listeners(conn, dsn: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE $2",
        database_of(dsn),
        "pgworker-listen:%",
    )


async def test_no_listen_opens_no_listen_connection_and_still_serves_by_polling(
    dsn, conn, tmp_path
):
    listening = start_worker(dsn, tmp_path / "listening.log", "--worker-id", "listening")
    try:
        await wait_for(lambda: listeners(conn, dsn), timeout=30)
    finally:
        await stop(listening)
    await wait_for(lambda: conn.fetchval("SELECT count(*) = 0 FROM pgworker.workers"), timeout=30)
    log = tmp_path / "worker.log"
    worker = start_worker(dsn, log, "--no-listen", "--poll-interval", "0.2", "--worker-id", "deaf")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pgworker.workers WHERE worker_id = 'deaf'"
            ),
            timeout=30,
        )
        job = await pgworker.enqueue(conn, "echo", {"n": 1})
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job.job.id
            ),
            timeout=30,
        )
        assert await listeners(conn, dsn) == 0
    finally:
        await stop(worker)


async def test_durable_claims_commit_as_the_server_is_configured(dsn, conn, tmp_path):
    """The claim sets synchronous_commit for its own transaction: `off` by default, the server's
    setting with --durable-claims. A trigger records what the claim's transaction runs with."""
    await conn.execute(f'ALTER DATABASE "{database_of(dsn)}" SET synchronous_commit = local')
    await conn.execute(
        """
        CREATE TABLE claim_commits (job_id bigint, synchronous_commit text);
        CREATE FUNCTION record_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO claim_commits VALUES (NEW.id, current_setting('synchronous_commit'));
            RETURN NEW;
        END $$;
        CREATE TRIGGER record_claim AFTER UPDATE ON pgworker.jobs FOR EACH ROW
            WHEN (OLD.status = 'pending' AND NEW.status = 'running')
            EXECUTE FUNCTION record_claim();
        """
    )
    for flags, expected in ((("--durable-claims",), "local"), ((), "off")):
        job = (await pgworker.enqueue(conn, "echo", {})).job.id
        worker = start_worker(dsn, tmp_path / f"{expected}.log", *flags)
        try:
            await wait_for(
                lambda job=job: conn.fetchval(
                    "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job
                ),
                timeout=30,
            )
        finally:
            await stop(worker)
        recorded = await conn.fetchval(
            "SELECT synchronous_commit FROM claim_commits WHERE job_id = $1", job
        )
        assert recorded == expected, flags


async def test_schema_option_works_end_to_end_on_another_schema(dsn, conn, tmp_path):
    migrated = cli("migrate", "--schema", "other", "--dsn", dsn)
    assert migrated.returncode == 0 and migrated.stdout.startswith("applied migrations"), migrated
    out = cli("enqueue", "echo", "--payload", '{"a": 1}', "--schema", "other", "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    done = json.loads(out.stdout)["id"]
    out = cli("enqueue", "echo", "--delay", "3600", "--schema", "other", "--dsn", dsn)
    later = json.loads(out.stdout)["id"]
    out = cli("cancel", str(later), "--schema", "other", "--dsn", dsn)
    assert out.stdout == f"job {later} cancelled (it was pending)\n", out.stderr
    worker = start_worker(dsn, tmp_path / "worker.log", "--schema", "other")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM other.jobs WHERE id = $1", done
            ),
            timeout=30,
        )
        status = json.loads(cli("status", "--json", "--schema", "other", "--dsn", dsn).stdout)
        assert (
            status["queues"]["default"]["completed"],
            status["queues"]["default"]["cancelled"],
        ) == (1, 1)
        assert len(status["workers"]) == 1
    finally:
        await stop(worker)
    assert await conn.fetchval("SELECT result FROM other.jobs WHERE id = $1", done) == '{"a": 1}'
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
    assert await conn.fetchval("SELECT count(*) FROM other.job_attempts") == 1


@pytest.mark.parametrize("by", ["options", "environment"])
async def test_log_level_warning_hides_the_info_lines(dsn, conn, tmp_path, by):
    ok = (await pgworker.enqueue(conn, "echo", {})).job.id
    bad = (await pgworker.enqueue(conn, "fail", {})).job.id
    log = tmp_path / "worker.log"
    if by == "options":
        worker = start_worker(dsn, log, "--log-format", "json", "--log-level", "warning")
    else:
        env = {"PGWORKER_LOG_FORMAT": "json", "PGWORKER_LOG_LEVEL": "warning"}
        worker = spawn_worker("tests.apps.basic", dsn, log, env=env)
    try:
        await wait_for(lambda: all_finished(conn), timeout=30)
    finally:
        await stop(worker)
    assert (await pgworker.get_job(conn, ok)).status == "completed"
    assert (await pgworker.get_job(conn, bad)).status == "failed"
    text = log.read_text()
    lines = json_lines(log)
    assert len(lines) == len(text.splitlines()), text
    assert {x["level"] for x in lines} <= {"warning", "error", "critical"}, text
    # Every attempt's end is an INFO line, a final failure included: none at this level.
    assert not any(x.get("job_id") in (ok, bad) for x in lines), text


# --- the parser's help -------------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [
        a for a in cli_module.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return dict(sub.choices)


SETTINGS_ENV = {f.name: f"PGWORKER_{f.name.upper()}" for f in dataclasses.fields(pgworker.Settings)}


@pytest.mark.parametrize("command", ["migrate", "run", "enqueue", "cancel", "status"])
async def test_every_option_says_what_it_does_its_default_and_its_variable(command):
    parser = subcommands()[command]
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, (command, action.dest)
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings:
            assert "(default: " in action.help, (command, action.dest, action.help)
        else:
            assert "(required)" in action.help, (command, action.dest, action.help)
        if action.dest in SETTINGS_ENV:  # read by Settings.from_env: the help names it
            assert SETTINGS_ENV[action.dest] in action.help, (command, action.dest, action.help)
    assert {"dsn", "schema"} <= {a.dest for a in parser._actions}


@pytest.mark.parametrize("command", ["migrate", "run", "enqueue", "cancel", "status"])
async def test_each_command_help_shows_examples(command, capsys):
    with pytest.raises(SystemExit) as exited:
        cli_module.main([command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    examples = text.split("\nexamples:\n", 1)[-1].strip().splitlines()
    assert "\nexamples:\n" in text and examples, text
    assert all(f"pgworker {command}" in line for line in examples), text


async def test_top_level_help_lists_each_command_with_one_line():
    out = cli_process("--help")  # the entry point, `python -m pgworker`
    assert out.returncode == 0
    listed = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("    ")}
    for command in ("migrate", "run", "enqueue", "cancel", "status"):
        assert command in listed and len(listed[command].split()) > 1, out.stdout
    assert "examples:\n  " in out.stdout


async def test_priority_is_parsed_before_connecting():
    # no database at that address: the label is refused first
    out = cli("enqueue", "t", "--priority", "urgent", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert out.returncode == 2
    assert "argument --priority: unknown label 'urgent'; use an int or one of low" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# --- status rendering --------------------------------------------------------------------------


def status_rows(**rows: list[dict]) -> dict[str, list[dict]]:
    return {"counts": [], "oldest_pending": [], "unserved": [], "workers": [], **rows}


async def test_age_uses_the_largest_unit():
    assert [_render.age(s) for s in (None, 0, 59.94, 60, 5400, 86400 * 3.25)] == [
        "-",
        "0.0s",
        "59.9s",
        "1.0m",
        "1.5h",
        "3.2d",
    ]


async def test_status_text_aligns_the_table_and_lists_workers_and_unserved_types():
    text = _render.status_text(
        status_rows(
            counts=[
                {"queue": "mail", "status": "pending", "jobs": 12},
                {"queue": "default", "status": "completed", "jobs": 1234},
                {"queue": "default", "status": "failed", "jobs": 1},
            ],
            oldest_pending=[{"queue": "mail", "age": 90.0}],
            workers=[{"worker_id": "w1", "queues": ["default", "mail"], "types": ["a", "b"]}],
            unserved=[{"queue": "mail", "type": "c"}],
        )
    )
    assert text.splitlines() == [
        "queue    pending  running  completed  failed  cancelled  oldest pending",
        "default  0        0        1234       1       0          -",
        "mail     12       0        0          0       0          1.5m",
        "",
        "live workers: 1",
        "  w1  queues=default,mail  types=a,b",
        "",
        "pending types that no live worker serves:",
        "  mail: c",
    ]


async def test_status_text_with_no_jobs_and_no_workers():
    assert _render.status_text(status_rows()).splitlines() == [
        "queue  pending  running  completed  failed  cancelled  oldest pending",
        "(no jobs)",
        "",
        "live workers: 0",
    ]


async def test_status_json_has_every_status_per_queue_and_the_oldest_age():
    data = json.loads(
        _render.status_json(
            status_rows(
                counts=[{"queue": "q", "status": "running", "jobs": 2}],
                workers=[{"worker_id": "w", "queues": ["q"], "types": ["t"], "pid": 1}],
                unserved=[{"queue": "q", "type": "u"}],
            )
        )
    )
    assert data == {
        "queues": {
            "q": {
                "pending": 0,
                "running": 2,
                "completed": 0,
                "failed": 0,
                "cancelled": 0,
                "oldest_pending_age_s": None,
            }
        },
        "workers": [{"worker_id": "w", "queues": ["q"], "types": ["t"]}],
        "unserved": [{"queue": "q", "type": "u"}],
        "controls": [],
    }


# --- a second SIGTERM ------------------------------------------------------------------------


async def outcomes(conn, job_id: int) -> list[str]:
    return [a["outcome"] for a in await attempts(conn, job_id)]


async def test_a_second_sigterm_hands_running_jobs_back_at_once(dsn, conn, tmp_path):
    """The grace period is ten minutes; the second signal must not wait for it."""
    r = await pgworker.enqueue(conn, "sleep", {"seconds": 3600})
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        "tests.apps.basic", dsn, log, "--shutdown-timeout", "600", "--log-format", "json"
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'running' FROM pgworker.jobs WHERE id = $1", r.job.id
            ),
            timeout=30,
        )
        worker.send_signal(signal.SIGTERM)
        # Two signals pending at once would be one: send the second once the first was read.
        await wait_for(lambda: "SIGTERM received" in log.read_text(), timeout=10)
        assert (await pgworker.get_job(conn, r.job.id)).status == "running"
        worker.send_signal(signal.SIGTERM)
        await wait_for(lambda: worker.poll() is not None, timeout=15)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == 0, log.read_text()
    job = await pgworker.get_job(conn, r.job.id)
    assert (job.status, job.retry_count) == ("pending", 0)
    assert await outcomes(conn, r.job.id) == ["interrupted"]


# --- show of a deep payload, of a payload that is not an object ------------------------------


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth - 1):
        value = {"password": "p4ssw0rd-deep", "next": value}
    return value


@pytest.mark.parametrize("form", ["text", "json"])
async def test_show_a_job_whose_payload_is_nested_as_deep_as_enqueue_allows(dsn, conn, form):
    """A payload nested 499 deep (enqueue takes 500) and a step result as deep: `pgworker show`
    died with a RecursionError traceback (redacting the payload, making it JSON)."""
    r = await pgworker.enqueue(conn, "deep", nested(499, 1))
    await conn.execute(
        "INSERT INTO pgworker.job_steps (job_id, name, result, attempt, started_at) "
        "VALUES ($1, 's', $2::jsonb, 1, now())",
        r.job.id,
        json.dumps(nested(400, [1])),
    )
    shown = cli("show", str(r.job.id), *(["--json"] if form == "json" else []), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert "p4ssw0rd-deep" not in shown.stdout.split("steps")[0]
    if form == "json":
        payload = json.loads(shown.stdout)["job"]["payload"]
        assert payload["password"] == "[REDACTED]"


@pytest.mark.parametrize("payload", [[1, {"token": "tok-12345"}], "a string", 42, None, True])
async def test_show_a_job_whose_payload_is_not_an_object(dsn, conn, payload):
    r = await pgworker.enqueue(conn, "scalar", payload)
    for extra in ([], ["--json"]):
        shown = cli("show", str(r.job.id), *extra, "--dsn", dsn)
        assert shown.returncode == 0, shown.stderr
        assert "tok-12345" not in shown.stdout


# --- show of a milestone Python cannot decode ------------------------------------------------


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.asyncio(loop_scope="session")
async def test_pgworker_show_of_a_milestone_python_cannot_decode_is_one_line(dsn, conn):
    """A milestone's detail nested too deep (written by SQL): `pgworker show ID` ended in a
    RecursionError traceback (and the dashboard's job page in a bare 500)."""
    job = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail) "
        "VALUES ($1, 1, 'm', $2::jsonb)",
        job,
        DEEP,
    )
    out = cli("show", str(job), "--dsn", dsn)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "milestone" in out.stderr
    assert "cannot be decoded" in out.stderr
