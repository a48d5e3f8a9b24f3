"""Failed jobs as a dead-letter set: `pgworker failed list`, `show` and
`replay` from the real CLI on a scratch database, and `list_failed` / `replay` from Python: what
they select, what a replay resets and keeps, what it records and logs, and the bad input that
writes nothing."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker import cli as cli_module
from pgworker import operations

from .helpers import attempts, cli, has_status, logged, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

FAST = pgworker.RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=0.01, jitter=0)
SECRET = "hunter2-xyz"


def flaky_registry(broken: dict[str, bool]) -> pgworker.Registry:
    """`flaky` fails while broken["now"], with two retries; `plain` completes."""
    registry = pgworker.Registry()

    @registry.task("flaky", retry=FAST)
    async def flaky(ctx: pgworker.JobContext, payload: dict) -> dict:
        if broken["now"]:
            raise ValueError(f"upstream broken (attempt {ctx.attempt})\nsecond line")
        return {"attempt": ctx.attempt}

    @registry.task("plain")
    async def plain(ctx: pgworker.JobContext, payload: dict) -> None:
        return None

    return registry


async def events(conn, job_id: int) -> list:
    return await conn.fetch(
        "SELECT kind, actor, reason, detail::text AS detail FROM pgworker.job_events "
        "WHERE job_id = $1 ORDER BY id",
        job_id,
    )


async def make_failed(conn, type_: str = "t", queue: str = "default", ago: float = 60.0) -> int:
    """A job that failed `ago` seconds ago, its one attempt recorded (no worker needed)."""
    r = await pgworker.enqueue(conn, type_, {"n": 1}, queue=queue)
    await conn.execute(
        """UPDATE pgworker.jobs SET status = 'failed', attempts = 1, retry_count = 1,
               max_retries = 0, error = 'ValueError: boom', worker_id = 'w',
               claimed_at = now() - make_interval(secs => $2 + 1),
               budget_started_at = now() - make_interval(secs => $2 + 1),
               finished_at = now() - make_interval(secs => $2)
           WHERE id = $1""",
        r.job.id,
        ago,
    )
    await conn.execute(
        """INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
               correlation_id, outcome, started_at, finished_at, error_type, error_message)
           SELECT id, 1, type, queue, 'w', correlation_id, 'failed', claimed_at, finished_at,
                  'ValueError', 'boom'
           FROM pgworker.jobs WHERE id = $1""",
        r.job.id,
    )
    return r.job.id


# --- the acceptance: the CLI on a scratch database --------------------------------------------


async def test_failed_list_show_replay_from_the_cli_and_the_replayed_job_completes(dsn, conn):
    broken = {"now": True}
    registry = flaky_registry(broken)
    job = (await pgworker.enqueue(conn, "flaky", {"password": SECRET, "n": 7}, queue="q1")).job
    other = (await pgworker.enqueue(conn, "plain", {})).job
    async with serving_guarded(registry, dsn, queues=["default", "q1"], worker_id="w-one"):
        await wait_for(lambda: has_status(conn, job.id, "failed"), timeout=30)
        await wait_for(lambda: has_status(conn, other.id, "completed"))

    # failed list: the job, with its attempts, their times, the error's first line
    listed = cli("failed", "list", "--dsn", dsn)
    assert listed.returncode == 0, listed.stderr
    [header, line, error] = listed.stdout.splitlines()
    assert header.split()[:5] == ["id", "type", "queue", "correlation", "id"]
    assert line.split()[:5] == [str(job.id), "flaky", "q1", job.correlation_id, "3"]
    assert error.strip() == "ValueError: upstream broken (attempt 3)"
    as_json = cli("failed", "list", "--json", "--type", "flaky", "--since", "1h", "--dsn", dsn)
    assert as_json.returncode == 0, as_json.stderr
    [item] = json.loads(as_json.stdout)
    assert list(item) == [
        "id",
        "type",
        "queue",
        "correlation_id",
        "attempts",
        "first_attempt_at",
        "last_attempt_at",
        "error",
    ]
    runs = await attempts(conn, job.id)
    assert item == {
        "id": job.id,
        "type": "flaky",
        "queue": "q1",
        "correlation_id": job.correlation_id,
        "attempts": 3,
        "first_attempt_at": runs[0]["started_at"].isoformat(),
        "last_attempt_at": runs[-1]["started_at"].isoformat(),
        "error": "ValueError: upstream broken (attempt 3)",
    }
    assert json.loads(cli("failed", "list", "--json", "--queue", "q2", "--dsn", dsn).stdout) == []

    # show: the job, its payload redacted, every attempt
    shown = cli("show", str(job.id), "--json", "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert SECRET not in shown.stdout
    found = json.loads(shown.stdout)
    assert found["job"]["payload"] == {"password": "[REDACTED]", "n": 7}
    assert found["job"]["status"] == "failed" and found["job"]["id"] == job.id
    assert [(a["attempt"], a["outcome"], a["worker_id"]) for a in found["attempts"]] == [
        (1, "retried", "w-one"),
        (2, "retried", "w-one"),
        (3, "failed", "w-one"),
    ]
    assert all(a["started_at"] and a["finished_at"] for a in found["attempts"])
    assert found["attempts"][2]["error_message"].startswith("upstream broken (attempt 3)")
    assert found["milestones"] == [] and found["steps"] == [] and found["events"] == []
    text = cli("show", str(job.id), "--dsn", dsn)
    assert text.returncode == 0 and SECRET not in text.stdout
    assert f"job {job.id}" in text.stdout and "#3  failed  worker w-one" in text.stdout

    # replay: back to pending with everything reset but its history
    replayed = cli(
        "replay", str(job.id), "--by", "alice", "--reason", "upstream fixed", "--dsn", dsn
    )
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.strip() == f"replayed job {job.id}"
    row = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", job.id)
    assert row["status"] == "pending" and row["retry_count"] == 0 and row["attempts"] == 3
    assert row["error"] is None and row["finished_at"] is None
    assert row["budget_started_at"] is None and row["cancel_requested_at"] is None
    assert row["run_at"] <= await conn.fetchval("SELECT now()")
    [event] = await events(conn, job.id)
    assert (event["kind"], event["actor"], event["reason"]) == (
        "replayed",
        "alice",
        "upstream fixed",
    )
    assert json.loads(event["detail"]) == {"previous_status": "failed", "attempts": 3}

    broken["now"] = False
    async with serving_guarded(registry, dsn, queues=["default", "q1"], worker_id="w-two"):
        await wait_for(lambda: has_status(conn, job.id, "completed"), timeout=30)
    runs = await attempts(conn, job.id)
    assert [a["attempt"] for a in runs] == [1, 2, 3, 4]
    assert [a["outcome"] for a in runs] == ["retried", "retried", "failed", "completed"]
    assert (await pgworker.get_job(conn, job.id)).result == {"attempt": 4}
    after = json.loads(cli("show", str(job.id), "--json", "--dsn", dsn).stdout)
    assert [(e["kind"], e["actor"], e["reason"]) for e in after["events"]] == [
        ("replayed", "alice", "upstream fixed")
    ]
    assert "replayed by alice: upstream fixed" in cli("show", str(job.id), "--dsn", dsn).stdout

    # a completed job is not replayed: said on stderr, exit status 1, nothing changed
    before = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", job.id)
    again = cli("replay", str(job.id), "--dsn", dsn)
    assert again.returncode == 1
    assert f"job {job.id} is completed" in again.stderr and "left as it is" in again.stderr
    assert await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", job.id) == before
    assert len(await events(conn, job.id)) == 1


async def test_a_replay_wakes_a_listening_worker_at_once(dsn, conn):
    """The replay's NOTIFY: a worker polling every 60 s claims the replayed job within seconds."""
    job_id = await make_failed(conn, "plain")
    registry = flaky_registry({"now": False})
    async with serving_guarded(registry, dsn, poll_interval=60.0):
        # Listening: LISTEN is the listener's first statement.
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'pgworker-listen:%' AND query <> ''"
            ),
        )
        result = await pgworker.replay(conn, [job_id], by="t")
        assert result.replayed == (job_id,)
        await wait_for(lambda: has_status(conn, job_id, "completed"), timeout=15)
    assert [a["attempt"] for a in await attempts(conn, job_id)] == [1, 2]


async def test_unknown_ids_and_bad_since_are_one_line_exit_2_and_write_nothing(dsn, conn):
    failed = await make_failed(conn)
    unknown = cli("replay", str(failed), "999999", "--dsn", dsn)
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "pgworker replay: error: ids: there is no job 999999; nothing was replayed"
    ]
    for args in (
        ("replay", "--type", "t", "--since", "yesterday"),
        ("replay", "--type", "t", "--since", "2030-01-01T09:00:00"),  # no time zone
        ("failed", "list", "--since", "-2h"),
    ):
        out = cli(*args, "--dsn", dsn)
        assert out.returncode == 2, (args, out.stderr)
        [line] = out.stderr.strip().splitlines()
        assert "--since" in line and "error" in line, line
    for args in (("replay",), ("replay", "1", "--type", "t"), ("replay", "1", "--since", "2h")):
        out = cli(*args, "--dsn", dsn)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert await has_status(conn, failed, "failed")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_events") == 0


async def test_replay_by_type_takes_failed_jobs_since_and_of_a_queue(dsn, conn):
    old = await make_failed(conn, "t", ago=3 * 3600)
    recent = await make_failed(conn, "t")
    other_queue = await make_failed(conn, "t", queue="q2")
    other_type = await make_failed(conn, "u")
    cancelled = (await pgworker.enqueue(conn, "t", {})).job.id
    await pgworker.cancel(conn, cancelled)

    dry = cli(
        "replay", "--type", "t", "--since", "2h", "--queue", "default", "--dry-run", "--dsn", dsn
    )
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == f"would replay job {recent}"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'pending'") == 0
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_events") == 0

    result = await pgworker.replay(conn, type="t", since=timedelta(hours=2), queue="default")
    assert result == pgworker.ReplayResult((recent,), {})
    for job_id, status in (
        (old, "failed"),
        (recent, "pending"),
        (other_queue, "failed"),
        (other_type, "failed"),
        (cancelled, "cancelled"),
    ):
        assert await has_status(conn, job_id, status), job_id
    # by type, every failed job of the type (cancelled ones are replayed by id only)
    result = await pgworker.replay(conn, type="t", reason="all of them")
    assert sorted(result.replayed) == sorted([old, other_queue])
    assert await has_status(conn, cancelled, "cancelled")
    assert (await pgworker.replay(conn, type="t")).replayed == ()


async def test_replay_by_id_takes_failed_and_cancelled_jobs_and_leaves_the_others(dsn, conn):
    failed = await make_failed(conn)
    cancelled = (await pgworker.enqueue(conn, "t", {})).job.id
    await pgworker.cancel(conn, cancelled)
    pending = (await pgworker.enqueue(conn, "t", {})).job.id
    dry = await pgworker.replay(conn, [failed, cancelled, pending], dry_run=True)
    assert dry == pgworker.ReplayResult((failed, cancelled), {pending: "pending"}, dry_run=True)
    assert await has_status(conn, failed, "failed")
    with capture_logs() as logs:
        result = await pgworker.replay(conn, [failed, cancelled, pending, failed], by="ops")
    assert result == pgworker.ReplayResult((failed, cancelled), {pending: "pending"})
    row = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", cancelled)
    assert row["status"] == "pending" and row["cancel_requested_at"] is None
    assert row["error"] is None and row["finished_at"] is None
    [line] = logged(logs, "job replayed", job_id=failed)
    assert line["actor"] == "ops" and line["previous_status"] == "failed"
    assert line["next_attempt"] == 2 and line["type"] == "t" and line["log_level"] == "info"
    assert "payload" not in line and '"n"' not in json.dumps(line, default=str)
    assert len(logged(logs, "job replayed")) == 2
    assert [e["actor"] for e in await events(conn, cancelled)] == ["ops"]
    assert await events(conn, pending) == []


async def test_replay_and_list_failed_refuse_bad_input_naming_the_field(dsn, conn):
    failed = await make_failed(conn)
    cases = [
        (dict(ids=[failed, 10**6]), "ids"),
        (dict(ids=[]), "ids"),
        (dict(ids="12"), "ids"),
        (dict(ids=[0]), "ids"),
        (dict(ids=[True]), "ids"),
        (dict(), "ids"),
        (dict(ids=[failed], type="t"), "ids"),
        (dict(type="t", since="soon"), "since"),
        (dict(type="t", since=datetime(2030, 1, 1)), "since"),
        (dict(type="t", since=-5), "since"),
        (dict(type=""), "type"),
        (dict(type="t", queue=""), "queue"),
        (dict(ids=[failed], by=""), "by"),
        (dict(ids=[failed], reason="x\x00"), "reason"),
        (dict(ids=[failed], dry_run="yes"), "dry_run"),
    ]
    for kwargs, field in cases:
        with pytest.raises(pgworker.ValidationError) as raised:
            await pgworker.replay(conn, **kwargs)
        assert raised.value.field == field, kwargs
    assert await has_status(conn, failed, "failed")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_events") == 0
    for kwargs, field in [
        (dict(since="2 hours"), "since"),
        (dict(limit=0), "limit"),
        (dict(type=5), "type"),
    ]:
        with pytest.raises(pgworker.ValidationError) as raised:
            await pgworker.list_failed(conn, **kwargs)
        assert raised.value.field == field


async def test_list_failed_filters_and_orders_newest_failure_first(dsn, conn):
    old = await make_failed(conn, "t", ago=3 * 86400)
    mid = await make_failed(conn, "t", queue="q2", ago=3600)
    new = await make_failed(conn, "u", ago=10)
    completed = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() WHERE id = $1",
        completed,
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET error = 'RuntimeError: first line\nsecond' WHERE id = $1", new
    )
    assert [j.id for j in await pgworker.list_failed(conn)] == [new, mid, old]
    assert [j.id for j in await pgworker.list_failed(conn, type="t")] == [mid, old]
    assert [j.id for j in await pgworker.list_failed(conn, queue="q2")] == [mid]
    assert [j.id for j in await pgworker.list_failed(conn, since="2d")] == [new, mid]
    assert [j.id for j in await pgworker.list_failed(conn, since=7200.0)] == [new, mid]
    since = datetime.now(UTC) - timedelta(minutes=30)
    assert [j.id for j in await pgworker.list_failed(conn, since=since)] == [new]
    assert [j.id for j in await pgworker.list_failed(conn, since=since.isoformat())] == [new]
    assert [j.id for j in await pgworker.list_failed(conn, limit=2)] == [new, mid]
    [first] = await pgworker.list_failed(conn, limit=1)
    assert first.error == "RuntimeError: first line" and first.attempts == 1
    assert first.first_attempt_at == first.last_attempt_at is not None


async def test_since_parses_durations_and_iso_times():
    now = datetime.now(UTC)
    for text, seconds in (("30s", 30), ("15m", 900), ("2h", 7200), ("7d", 7 * 86400), ("90", 90)):
        moment = operations.since_moment("since", text)
        assert moment is not None
        assert abs((now - moment).total_seconds() - seconds) < 5, text
    assert operations.since_moment("since", "2030-01-01T09:00:00+01:00") == datetime(
        2030, 1, 1, 8, tzinfo=UTC
    )
    assert operations.since_moment("since", None) is None


# --- the parser's help --------------------------------------------------------------------------


def commands() -> dict[str, argparse.ArgumentParser]:
    [sub] = [
        a for a in cli_module.build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    found = dict(sub.choices)
    [failed_sub] = [
        a for a in found["failed"]._actions if isinstance(a, argparse._SubParsersAction)
    ]
    found["failed list"] = failed_sub.choices["list"]
    return found


@pytest.mark.parametrize("command", ["failed list", "show", "replay", "prune"])
async def test_every_new_option_says_its_default_and_each_command_shows_examples(command, capsys):
    parser = commands()[command]
    for action in parser._actions:
        assert action.help and action.help != argparse.SUPPRESS, (command, action.dest)
        if isinstance(action, argparse._HelpAction):
            continue
        if action.option_strings and not action.required:
            assert "(default: " in action.help, (command, action.dest, action.help)
        else:
            assert "(required" in action.help, (command, action.dest, action.help)
    assert {"dsn", "schema"} <= {a.dest for a in parser._actions}
    with pytest.raises(SystemExit) as exited:
        cli_module.main([*command.split(), "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    examples = text.split("\nexamples:\n", 1)[-1].strip().splitlines()
    assert "\nexamples:\n" in text and examples, text
    assert all(f"pgworker {command}" in line for line in examples), text


async def test_a_since_time_without_a_zone_says_how_to_add_one():
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.list_failed(None, since="2026-01-01T00:00:00")  # type: ignore[arg-type]
    assert caught.value.field == "since"
    assert "has no time zone; add one, e.g. 2026-01-01T00:00:00+00:00" in str(caught.value)
