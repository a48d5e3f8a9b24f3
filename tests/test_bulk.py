"""The job lists' one filter (service, HTTP API, CLI), and bulk actions over
it (replay, cancel, delete, reschedule) in batches, resumable after a kill, each job handled once
and recorded; against a real database, the real CLI and a real `pgworker serve`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

import pgworker
from pgworker import _bulk as bulk
from pgworker._filters import FIELDS, JobFilter
from pgworker.errors import ValidationError

from .helpers import cli, cli_process, has_status, serving_guarded, wait_for
from .test_dashboard import csrf_of, http
from .webserver import ROOT, Served, server, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name


async def seed_failed(
    conn: Any,
    n: int,
    *,
    type_: str = "send-invoice",
    error: str = "ValueError: remote down",
    **payload: Any,
) -> list[int]:
    """`n` failed jobs inserted by SQL (each with one failed attempt), their ids."""
    rows = await conn.fetch(
        """
        INSERT INTO pgworker.jobs (type, queue, payload, status, attempts, max_retries, error,
                                   finished_at)
        SELECT $1, 'mail', jsonb_build_object('n', g) || $4::jsonb, 'failed', 1, 0, $2, now()
        FROM generate_series(1, $3) AS g
        RETURNING id
        """,
        type_,
        error,
        n,
        json.dumps(payload),
    )
    ids = [r["id"] for r in rows]
    await conn.execute(
        """
        INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                           correlation_id, outcome, finished_at, error_type,
                                           error_message, error_detail)
        SELECT j.id, 1, j.type, j.queue, 'w', j.correlation_id, 'failed', now(), 'ValueError',
               j.error, 'Traceback (most recent call last):\n  ...\n' || j.error
        FROM pgworker.jobs AS j WHERE j.id = ANY($1::bigint[])
        """,
        ids,
    )
    # Each error's group (migration 30), as the outcome's write gives the attempt and its job.
    await conn.execute(
        """
        WITH grouped AS (
            UPDATE pgworker.job_attempts AS a
            SET error_group = pgworker.error_group(a.type, a.error_type, a.error_message,
                                                   a.error_detail)
            WHERE a.job_id = ANY($1::bigint[])
            RETURNING a.job_id, a.error_group
        )
        UPDATE pgworker.jobs AS j SET error_group = g.error_group
        FROM grouped AS g WHERE j.id = g.job_id
        """,
        ids,
    )
    return ids


async def replays_of(conn: Any, ids: list[int]) -> dict[int, int]:
    rows = await conn.fetch(
        "SELECT job_id, count(*) AS n FROM pgworker.job_events WHERE kind = 'replayed' "
        "AND job_id = ANY($1::bigint[]) GROUP BY job_id",
        ids,
    )
    return {r["job_id"]: r["n"] for r in rows}


# --- the filter --------------------------------------------------------------------------------


async def test_each_bad_filter_field_is_named() -> None:
    bad = {
        "status": "broken",
        "queue": "q" * 64,
        "type": "\x00",
        "error": "e" * 501,
        "created_after": "yesterday",
        "created_before": "2030-01-01T00:00:00",
        "finished_after": "soon",
        "finished_before": "12:00",
        "correlation_id": "c" * 201,
        "id": "٣",
        "payload": "[1, 2]",
        "error_group": "3F9C0A1B2C3D4E5F",  # a fingerprint is lowercase hex
        "ids": "1,x",
    }
    assert set(bad) == set(FIELDS)
    for field, value in bad.items():
        with pytest.raises(ValidationError) as caught:
            JobFilter.parse({field: value})
        assert caught.value.field == field, (field, caught.value)
    with pytest.raises(ValidationError) as caught:
        JobFilter.parse({"colour": "red"})
    assert caught.value.field == "colour"


async def test_a_filter_reads_back_from_its_query_and_its_json() -> None:
    f = JobFilter.parse(
        {
            "status": "failed",
            "type": "send",
            "error": "50%_off",
            "created_after": "2030-01-01T14:02:00+00:00",
            "payload": '{"customer_id": 42}',
            "id": "7",
        }
    )
    assert JobFilter.parse(f.query()) == f
    assert JobFilter.parse(f.as_json()) == f
    assert f.params()[3] == "%50\\%\\_off%"  # the text searched as it is, not as a pattern


async def test_the_filter_matches_what_it_says(conn: Any) -> None:
    ids = await seed_failed(conn, 3, customer_id=42)
    other = await seed_failed(conn, 2, type_="report", error="KeyError: 'x'", customer_id=7)
    from pgworker._db.queries import queries, transaction

    q = queries("pgworker")

    async def found(**values: Any) -> set[int]:
        async with transaction(conn) as c:
            await q.plan_with_values(c)
            rows = await q.jobs_filtered(c, JobFilter.parse(values).params(), None, 100)
        return {r["id"] for r in rows}

    assert await found(type="send") == set(ids)
    assert await found(type="send-invoice-x") == set()
    assert await found(error="REMOTE down") == set(ids)
    assert await found(error="%") == set()
    assert await found(payload='{"customer_id": 7}') == set(other)
    assert await found(id=str(ids[0])) == {ids[0]}
    assert await found(status="pending") == set()
    assert await found(created_after="1h") == set(ids + other)
    assert await found(finished_before="1h") == set()
    groups = await q.jobs_failure_groups(
        conn, JobFilter.parse({"status": "failed", "finished_after": "1d"}).params(), 10
    )
    assert [(g["sample"], g["error_class"], g["count"]) for g in groups] == [
        ("ValueError: remote down", "ValueError", 3),
        ("KeyError: 'x'", "KeyError", 2),
    ]
    assert await found(error_group=groups[1]["fingerprint"]) == set(other)


# --- bulk actions, in Python ---------------------------------------------------------------------


async def test_a_bulk_replay_in_batches_replays_each_job_once_and_not_later_ones(
    conn: Any, pool: Any
) -> None:
    ids = await seed_failed(conn, 1234)
    f = JobFilter.parse({"status": "failed", "error": "remote down"})
    action = await bulk.create(pool, "replay", f, by="alice", reason="remote is back")
    assert (action.matched, action.state, action.done) == (1234, "running", 0)
    late = await seed_failed(conn, 5)  # enqueued after: stays out
    seen: list[int] = []
    done = await bulk.run(pool, action.id, batch=100, progress=lambda a: seen.append(a.done))
    assert (done.state, done.done, done.skipped) == ("done", 1234, 0)
    assert seen[:3] == [100, 200, 300] and len(seen) == 13
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)
    assert await replays_of(conn, late) == {}
    actors = await conn.fetch(
        "SELECT DISTINCT actor, reason FROM pgworker.job_events WHERE kind = 'replayed'"
    )
    assert [(r["actor"], r["reason"]) for r in actors] == [("alice", "remote is back")]
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs"
            " WHERE id = ANY($1::bigint[]) AND status = 'pending'",
            ids,
        )
        == 1234
    )


async def test_cancel_delete_and_reschedule_touch_only_the_states_they_fit(
    conn: Any, pool: Any
) -> None:
    failed = await seed_failed(conn, 5)
    pending = [
        r["id"]
        for r in await conn.fetch(
            "INSERT INTO pgworker.jobs (type, queue) SELECT 'send-invoice', 'mail' "
            "FROM generate_series(1, 7) RETURNING id"
        )
    ]
    everything = JobFilter.parse({"type": "send-invoice"})
    when = datetime(2031, 1, 1, tzinfo=UTC)
    moved = await bulk.run(
        pool, (await bulk.create(pool, "reschedule", everything, run_at=when, by="bob")).id, batch=3
    )
    assert (moved.done, moved.skipped, moved.matched) == (7, 5, 12)
    assert {
        r["run_at"]
        for r in await conn.fetch(
            "SELECT run_at FROM pgworker.jobs WHERE id = ANY($1::bigint[])", pending
        )
    } == {when}
    cancelled = await bulk.run(
        pool, (await bulk.create(pool, "cancel", everything, by="bob")).id, batch=3
    )
    assert (cancelled.done, cancelled.skipped) == (7, 5)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.job_events WHERE kind = 'cancelled' AND actor = 'bob'"
        )
        == 7
    )
    deleted = await bulk.run(
        pool,
        (await bulk.create(pool, "delete", JobFilter.parse({"status": "failed"}), by="carol")).id,
        batch=2,
    )
    assert (deleted.done, deleted.matched) == (5, 5)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1::bigint[])", failed
        )
        == 0
    )
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.job_attempts WHERE job_id = ANY($1::bigint[])", failed
        )
        == 0
    )
    logged = await conn.fetch(
        "SELECT detail FROM pgworker.operator_log WHERE action = 'delete' AND actor = 'carol'"
    )
    assert sorted(i for r in logged for i in json.loads(r["detail"])["ids"]) == failed
    with pytest.raises(ValidationError) as caught:
        await bulk.create(pool, "reschedule", everything)
    assert caught.value.field == "run_at"
    with pytest.raises(ValidationError) as caught:
        await bulk.create(pool, "explode", everything)
    assert caught.value.field == "kind"


# --- the CLI -------------------------------------------------------------------------------------


async def test_jobs_list_filters_pages_and_escapes(conn: Any, dsn: str) -> None:
    ids = await seed_failed(conn, 3, error="ValueError: \x1b[31mred\x1b[0m down", customer_id=42)
    await seed_failed(conn, 2, type_="report")
    found = cli("jobs", "list", "--type", "send", "--limit", "2", "--json", "--dsn", dsn)
    assert found.returncode == 0, found.stderr
    page = json.loads(found.stdout)
    assert [j["id"] for j in page["jobs"]] == [ids[2], ids[1]] and page["next_before"] == ids[1]
    assert page["jobs"][0]["error"].startswith("ValueError:")
    rest = cli("jobs", "list", "--type", "send", "--before", str(ids[1]), "--json", "--dsn", dsn)
    assert [j["id"] for j in json.loads(rest.stdout)["jobs"]] == [ids[0]]
    table = cli("jobs", "list", "--payload", '{"customer_id": 42}', "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "red" in table.stdout
    assert str(ids[0]) in table.stdout and "report" not in table.stdout
    bad = cli("jobs", "list", "--created-after", "yesterday", "--dsn", dsn)
    assert bad.returncode != 0 and "--created-after" in bad.stderr and "Traceback" not in bad.stderr


async def test_replay_filter_asks_for_the_count_and_replays_in_batches(conn: Any, dsn: str) -> None:
    ids = await seed_failed(conn, 30)
    refused = cli_process("replay", "--filter", "--status", "failed", "--dsn", dsn)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    assert await replays_of(conn, ids) == {}
    done = cli_process(
        "replay",
        "--filter",
        "--status",
        "failed",
        "--type",
        "send",
        "--yes",
        "--batch-size",
        "7",
        "--by",
        "alice",
        "--dsn",
        dsn,
    )
    assert done.returncode == 0, done.stderr
    assert "30 jobs replayed" in done.stdout
    assert "28 of 30 handled" in done.stderr  # progress, batch by batch
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)
    cancelled = cli("cancel", "--filter", "--status", "pending", "--yes", "--dsn", dsn)
    assert cancelled.returncode == 0 and "30 jobs cancelled" in cancelled.stdout, cancelled.stderr


async def test_a_bulk_replay_killed_midway_resumes_and_handles_each_job_once(
    conn: Any, dsn: str, pool: Any
) -> None:
    ids = await seed_failed(conn, 3000)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgworker",
            "replay",
            "--filter",
            "--status",
            "failed",
            "--yes",
            "--batch-size",
            "10",
            "--dsn",
            dsn,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT coalesce(max(done), 0) >= 200 FROM pgworker.bulk_actions"
            ),
            timeout=60,
        )
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    row = await conn.fetchrow("SELECT id, done, state FROM pgworker.bulk_actions")
    assert row["state"] == "running" and 200 <= row["done"] < 3000
    resumed = await bulk.run(pool, row["id"], batch=500)
    assert (resumed.state, resumed.done, resumed.skipped) == ("done", 3000, 0)
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)


# --- the HTTP API --------------------------------------------------------------------------------


async def test_api_bulk_replay_answers_202_then_progress_to_done(conn: Any, dsn: str) -> None:
    ids = await seed_failed(conn, 5000)
    async with (
        serving(dsn, env={"PGWORKER_BULK_BATCH": "250"}) as served,
        served.client(timeout=30) as c,
    ):
        listed = await c.get("/jobs", params={"error": "remote", "type": "send", "limit": 3})
        assert listed.status_code == 200, listed.text
        assert [j["id"] for j in listed.json()["jobs"]] == ids[::-1][:3]
        started = await c.post(
            "/jobs/actions/replay",
            json={"filter": {"status": "failed", "error": "remote down"}, "by": "alice"},
        )
        assert started.status_code == 202, started.text
        action = started.json()
        assert action["matched"] == 5000 and action["status"] == "running"

        async def finished() -> bool:
            r = await c.get(f"/jobs/actions/{action['id']}")
            assert r.status_code == 200, r.text
            return r.json()["status"] == "done"

        await wait_for(finished, timeout=120, every=0.2)
        final = (await c.get(f"/jobs/actions/{action['id']}")).json()
        assert (final["done"], final["skipped"], final["actor"]) == (5000, 0, "alice")
        assert (await c.get("/jobs/actions/999999")).status_code == 404
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)


async def test_api_bad_filters_are_422_naming_the_field(server: Served, conn: Any) -> None:
    async with server.client() as c:
        for params, field in [
            ({"status": "broken"}, "status"),
            ({"created_after": "yesterday"}, "created_after"),
            ({"payload": "{not json}"}, "payload"),
            ({"id": "x"}, "id"),
        ]:
            r = await c.get("/jobs", params=params)
            assert r.status_code == 422, (params, r.text)
            assert r.json().get("field") == field, (params, r.json())
        r = await c.post("/jobs/actions/replay", json={"filter": {"colour": "red"}})
        assert r.status_code == 422 and "colour" in r.text, r.text
        r = await c.post("/jobs/actions/reschedule", json={"filter": {}})
        assert r.status_code == 422 and r.json().get("field") == "run_at", r.text
        r = await c.post("/jobs/actions/delete", json={"filter": {"payload": [1]}})
        assert r.status_code == 422 and "payload" in r.json().get("field", ""), r.text
    assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 0


async def test_api_bulk_actions_are_refused_by_a_read_only_server(dsn: str, conn: Any) -> None:
    async with serving(dsn, "--read-only") as served, served.client() as c:
        r = await c.post("/jobs/actions/cancel", json={"filter": {}})
        assert r.status_code == 405, r.text
    assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 0


async def test_serve_resumes_an_action_left_running(dsn: str, conn: Any, pool: Any) -> None:
    ids = await seed_failed(conn, 40)
    action = await bulk.create(pool, "replay", JobFilter(status="failed"), by="cron")
    await bulk.run_batch(pool, action.id, batch=15)  # then "killed"
    async with (
        serving(dsn) as served,
        httpx.AsyncClient(base_url=served.url, headers=served.headers) as c,
    ):

        async def finished() -> bool:
            return (await c.get(f"/jobs/actions/{action.id}")).json()["status"] == "done"

        await wait_for(finished, timeout=30, every=0.1)
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)


# --- a reschedule to year 1, controls in jobs list --json, a form field sent as a file


async def test_a_reschedule_to_the_first_moment_of_year_1_does_not_stop_the_workers(dsn, conn):
    """0001-01-01T00:00:00Z is a valid RFC 3339 time, but asyncpg sends it as '-infinity': a job
    run_at -infinity made every claim of its queue fail (claimed_at - run_at overflows), and the
    worker's producer retried forever. It is kept one microsecond later, a finite time."""
    victim = await pgworker.enqueue(conn, "t", {}, queue="mail")
    async with serving(dsn) as served, served.client() as client:
        started = await client.post(
            "/jobs/actions/reschedule",
            json={"filter": {"queue": "mail"}, "run_at": "0001-01-01T00:00:00Z"},
        )
        assert started.status_code == 202, started.text
        action = started.json()["id"]

        async def done() -> bool:
            return (await client.get(f"/jobs/actions/{action}")).json()["status"] == "done"

        await wait_for(done, timeout=30)
        answered = (await client.get(f"/jobs/{victim.job.id}")).json()["run_at"]
        assert answered.startswith("0001-01-01T00:00:00.000001") and answered.endswith("+00:00")
    direct = await pgworker.enqueue(conn, "t", {}, run_at=datetime.min.replace(tzinfo=UTC))
    finite = "SELECT bool_and(isfinite(run_at)) FROM pgworker.jobs WHERE id = ANY($1)"
    assert await conn.fetchval(finite, [victim.job.id, direct.job.id])
    registry = pgworker.Registry()

    @registry.task("t")
    async def t(ctx: Any, payload: Any) -> None:
        return None

    async with serving_guarded(registry, dsn, queues=["mail", "default"]):
        for job_id in (victim.job.id, direct.job.id):
            await wait_for(lambda j=job_id: has_status(conn, j, "completed"), timeout=20)


async def test_jobs_list_json_stays_json_with_control_characters_from_the_database(dsn, conn):
    """`jobs list --json` of a job whose values hold C1 controls (U+009B, the 8-bit CSI), ESC and
    a bidi override: valid JSON that gives the values back, and no raw control reaches the
    terminal (the escaper turned U+009B into `\\x9b`, which is not JSON)."""
    odd = "corr\u009b31m\x1b[2J\u202e"
    await pgworker.enqueue(conn, "t\x1b]0;pwned\x07", {}, correlation_id=odd)
    done = cli("jobs", "list", "--json", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07\u009b\u202e")
    (job,) = json.loads(done.stdout)["jobs"]
    assert job["correlation_id"] == odd and job["type"] == "t\x1b]0;pwned\x07"


async def test_a_bulk_forms_field_sent_as_a_file_is_refused_not_dropped(dsn, conn):
    """The confirmation's hidden fields are the filter: one sent as a file (multipart) was left
    out, and the action widened to every job (`status` dropped: every job replayed); `max_id` as
    a file was a 500. Each is refused (400) naming the field, and no action is created."""
    async with serving(dsn) as served, http(served) as client:
        csrf = csrf_of((await client.get("/ui/jobs")).text)
        for field in ("status", "queue", "max_id", "run_at"):
            form = {"csrf": csrf, "kind": "reschedule", "queue": "mail", "status": "pending"}
            form.pop(field, None)
            answer = await client.post(
                "/ui/jobs/actions", data=form, files={field: ("f", b"failed", "text/plain")}
            )
            assert answer.status_code == 400, (field, answer.status_code, answer.text[:300])
            assert f"{field}: must be text" in answer.text
    assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 0
