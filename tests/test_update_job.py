"""update_job against the real PostgreSQL: a pending job is rescheduled,
reprioritised or given a new payload, recorded in job_events; a job that runs or ended, a parked
job's run_at, an unknown id and bad values are refused with nothing changed; the CLI's
`pgworker job update` and HTTP's PATCH /jobs/{id} do the same."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

import pgworker

from .helpers import cli
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

LATER = datetime(2040, 1, 2, 3, 4, 5, tzinfo=UTC)


async def row_of(conn: Any, job_id: int) -> Any:
    return await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", job_id)


async def test_a_pending_job_is_rescheduled_reprioritised_and_given_a_payload(conn):
    job = (await pgworker.enqueue(conn, "t", {"v": 1}, unique_key="u")).job
    moved = await pgworker.update_job(conn, job.id, run_at=LATER)
    assert (moved.run_at, moved.priority, moved.payload) == (LATER, 0, {"v": 1})
    assert moved.unique_key == "u"
    both = await pgworker.update_job(conn, job.id, priority="high", payload={"v": 2}, by="ops")
    assert (both.run_at, both.priority, both.payload) == (LATER, 20, {"v": 2})
    stored = await pgworker.get_job(conn, job.id)
    assert (stored.run_at, stored.priority, stored.payload) == (LATER, 20, {"v": 2})
    events = await conn.fetch(
        "SELECT kind, actor, detail FROM pgworker.job_events WHERE job_id = $1 ORDER BY id", job.id
    )
    assert [(e["kind"], e["actor"]) for e in events][1:] == [("updated", "ops")]
    assert json.loads(events[1]["detail"]) == {"priority": [0, 20], "payload": "changed"}


@pytest.mark.parametrize("status", ["running", "completed", "failed", "cancelled"])
async def test_a_job_not_pending_is_refused_and_left_alone(conn, status):
    job = (await pgworker.enqueue(conn, "t", {"v": 1})).job
    await conn.execute("UPDATE pgworker.jobs SET status = $2 WHERE id = $1", job.id, status)
    before = await row_of(conn, job.id)
    with pytest.raises(pgworker.JobNotPending, match=f"is {status}") as caught:
        await pgworker.update_job(conn, job.id, priority=5)
    assert (caught.value.job_id, caught.value.status) == (job.id, status)
    assert await row_of(conn, job.id) == before
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_events") == 0


async def test_a_parked_jobs_run_at_is_refused_but_its_priority_may_change(conn):
    job = (await pgworker.enqueue(conn, "t", {})).job
    await conn.execute("UPDATE pgworker.jobs SET run_at = 'infinity' WHERE id = $1", job.id)
    before = await row_of(conn, job.id)
    with pytest.raises(pgworker.ValidationError, match="parked") as caught:
        await pgworker.update_job(conn, job.id, run_at=LATER, priority=3)
    assert caught.value.field == "run_at"
    assert await row_of(conn, job.id) == before
    assert (await pgworker.update_job(conn, job.id, priority=3)).priority == 3


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({}, "fields", "at least one"),
    ({"run_at": datetime(2040, 1, 1)}, "run_at", "timezone-aware"),
    ({"run_at": "tomorrow"}, "run_at", "."),
    ({"priority": 2**31}, "priority", "."),
    ({"priority": "urgent"}, "priority", "label"),
    ({"payload": {"x": float("nan")}}, "payload", "."),
    ({"payload": "a\x00b"}, "payload", "."),
]


@pytest.mark.parametrize(
    ("given", "field", "says"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)]
)
async def test_bad_input_names_the_field_and_changes_nothing(conn, given, field, says):
    job = (await pgworker.enqueue(conn, "t", {"v": 1})).job
    before = await row_of(conn, job.id)
    with pytest.raises(pgworker.ValidationError, match=says) as caught:
        await pgworker.update_job(conn, job.id, **given)
    assert caught.value.field == field
    assert await row_of(conn, job.id) == before


@pytest.mark.parametrize("job_id", [123456, 0, -1, True, "7"])
async def test_an_unknown_or_bad_id_is_refused(conn, job_id):
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.update_job(conn, job_id, priority=1)
    assert caught.value.field == "job_id"


async def test_the_cli_updates_a_pending_job(conn, dsn):
    job = (await pgworker.enqueue(conn, "t", {"v": 1})).job
    out = cli(
        "job",
        "update",
        str(job.id),
        "--run-at",
        "2040-01-02T03:04:05+00:00",
        "--priority",
        "high",
        "--payload",
        '{"v": 2}',
        "--by",
        "alice",
        "--dsn",
        dsn,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "id": job.id,
        "status": "pending",
        "run_at": LATER.isoformat(),
        "priority": 20,
    }
    stored = await pgworker.get_job(conn, job.id)
    assert (stored.run_at, stored.priority, stored.payload) == (LATER, 20, {"v": 2})
    shown = cli("show", str(job.id), "--dsn", dsn)
    assert "updated by alice" in shown.stdout, shown
    nothing = cli("job", "update", str(job.id), "--dsn", dsn)
    assert nothing.returncode == 2 and "at least one" in nothing.stderr
    naive = cli("job", "update", str(job.id), "--run-at", "2040-01-02T03:04:05", "--dsn", dsn)
    assert naive.returncode == 2 and "time zone" in naive.stderr
    unknown = cli("job", "update", "999999", "--priority", "1", "--dsn", dsn)
    assert unknown.returncode == 2 and "there is no job 999999" in unknown.stderr
    await conn.execute("UPDATE pgworker.jobs SET status = 'running' WHERE id = $1", job.id)
    running = cli("job", "update", str(job.id), "--priority", "1", "--dsn", dsn)
    assert running.returncode == 2 and "is running" in running.stderr, running
    assert (await pgworker.get_job(conn, job.id)).priority == 20


async def test_http_patch_updates_a_pending_job(conn, dsn):
    job = (await pgworker.enqueue(conn, "t", {"v": 1})).job
    async with serving(dsn) as served, served.client() as api:
        done = await api.patch(f"/jobs/{job.id}", json={"run_at": LATER.isoformat(), "priority": 7})
        assert done.status_code == 200, done.text
        assert (done.json()["priority"], done.json()["id"]) == (7, job.id)
        assert (await api.patch("/jobs/999999", json={"priority": 1})).status_code == 404
        for bad, field in [
            ({}, "fields"),
            ({"priority": "urgent"}, "priority"),
            ({"run_at": "2040-01-01T00:00:00"}, "run_at"),
            ({"nope": 1}, "nope"),
        ]:
            refused = await api.patch(f"/jobs/{job.id}", json=bad)
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == field, refused.text
        await conn.execute("UPDATE pgworker.jobs SET status = 'completed' WHERE id = $1", job.id)
        ended = await api.patch(f"/jobs/{job.id}", json={"priority": 1})
        assert ended.status_code == 409 and "completed" in ended.json()["error"], ended.text
    stored = await pgworker.get_job(conn, job.id)
    assert (stored.run_at, stored.priority) == (LATER, 7)
