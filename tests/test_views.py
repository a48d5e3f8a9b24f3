"""The dashboard views of migration 7: each returns the right rows for a small
known set of jobs and attempts, and each answers through an index in under 50 ms over a million
attempts and 50,000 jobs. docs/operations/monitoring.md documents every column."""

from __future__ import annotations

import itertools
import json
import re
import time
from typing import Any

import pytest

from .docs import page, section

pytestmark = pytest.mark.asyncio(loop_scope="session")

VIEWS = ["type_stats", "recent_failures", "overdue_jobs", "queue_backlog", "worker_activity"]


async def job(conn: Any, **columns: Any) -> int:
    """Insert a job with these columns (SQL expressions relative to now(), given as text)."""
    names = ", ".join(columns)
    values = ", ".join(str(v) for v in columns.values())
    return int(
        await conn.fetchval(f"INSERT INTO pgworker.jobs ({names}) VALUES ({values}) RETURNING id")
    )


_job_ids = itertools.count(1)


async def attempt(
    conn: Any, type_: str, outcome: str, started_ago: float, run_s: float | None
) -> None:
    """An attempt started `started_ago` seconds ago that ran `run_s` seconds (None: running)."""
    await conn.execute(
        "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, "
        "correlation_id, outcome, started_at, finished_at) "
        "SELECT $1, 1, $2, 'default', 'w', 'c', $3, s, s + make_interval(secs => $5::float8) "
        "FROM (SELECT now() - make_interval(secs => $4::float8) AS s) AS t",
        next(_job_ids),
        type_,
        outcome,
        started_ago,
        run_s,
    )


async def test_type_stats_counts_the_last_hour_per_type(conn):
    for outcome, run_s in [
        ("completed", 1),
        ("completed", 3),
        ("failed", 2),
        ("timed_out", 5),
        ("retried", 4),
        ("running", None),
    ]:
        await attempt(conn, "a", outcome, 600, run_s)
    await attempt(conn, "a", "failed", 7200, 1)  # before the window
    await attempt(conn, "b", "completed", 60, 10)
    await attempt(conn, "c", "snoozed", 30, 1)
    rows = {r["type"]: dict(r) for r in await conn.fetch("SELECT * FROM pgworker.type_stats")}
    assert set(rows) == {"a", "b", "c"}
    a = rows["a"]
    assert (a["attempts"], a["running"], a["completed"], a["failed"], a["timed_out"]) == (
        6,
        1,
        2,
        1,
        1,
    )
    assert a["retried"] == 1
    assert a["failure_rate"] == pytest.approx(3 / 5)
    assert a["p50_seconds"] == pytest.approx(3)
    assert a["p95_seconds"] == pytest.approx(4.8)
    b = rows["b"]
    assert (b["attempts"], b["completed"], b["failure_rate"]) == (1, 1, 0.0)
    assert b["p50_seconds"] == pytest.approx(10) and b["p95_seconds"] == pytest.approx(10)
    c = rows["c"]
    assert (c["attempts"], c["completed"], c["failed"], c["failure_rate"]) == (1, 0, 0, 0.0)


async def test_recent_failures_lists_the_newest_failed_jobs_first(conn):
    old = await job(
        conn,
        type="'t'",
        queue="'q1'",
        status="'failed'",
        attempts=3,
        error="'old boom'",
        correlation_id="'corr-old'",
        finished_at="now() - interval '1 hour'",
    )
    new = await job(
        conn,
        type="'u'",
        queue="'q2'",
        status="'failed'",
        attempts=1,
        error="'new boom'",
        correlation_id="'corr-new'",
        finished_at="now() - interval '1 minute'",
    )
    await job(conn, type="'t'", status="'completed'", finished_at="now()")
    await job(conn, type="'t'", status="'pending'")
    rows = [dict(r) for r in await conn.fetch("SELECT * FROM pgworker.recent_failures")]
    assert [r["id"] for r in rows] == [new, old]
    first = rows[0]
    assert {k: first[k] for k in ("type", "queue", "correlation_id", "attempts", "error")} == {
        "type": "u",
        "queue": "q2",
        "correlation_id": "corr-new",
        "attempts": 1,
        "error": "new boom",
    }
    assert first["finished_at"] is not None
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, status, error, finished_at) "
        "SELECT 'many', 'failed', 'x', now() - g * interval '100 ms' "
        "FROM generate_series(1, 105) AS g"
    )
    rows = await conn.fetch("SELECT * FROM pgworker.recent_failures")
    assert len(rows) == 100 and {r["type"] for r in rows} == {"many"}


async def test_overdue_jobs_are_the_running_ones_past_their_lease(conn):
    late = await job(
        conn,
        type="'t'",
        status="'running'",
        worker_id="'w1'",
        attempts=1,
        lease_expires_at="now() - interval '30 seconds'",
    )
    await job(
        conn,
        type="'t'",
        status="'running'",
        worker_id="'w2'",
        attempts=1,
        lease_expires_at="now() + interval '30 seconds'",
    )
    await job(conn, type="'t'", status="'pending'")
    rows = await conn.fetch("SELECT * FROM pgworker.overdue_jobs")
    assert [(r["id"], r["type"], r["worker_id"]) for r in rows] == [(late, "t", "w1")]
    assert 29 <= rows[0]["overdue_by"].total_seconds() < 40
    assert rows[0]["lease_expires_at"] is not None


async def test_queue_backlog_counts_the_due_pending_jobs_per_queue(conn):
    await job(conn, type="'t'", queue="'q1'", run_at="now() - interval '60 seconds'")
    await job(conn, type="'t'", queue="'q1'", run_at="now() - interval '10 seconds'")
    await job(conn, type="'t'", queue="'q1'", run_at="now() + interval '1 hour'")
    await job(
        conn,
        type="'t'",
        queue="'q1'",
        status="'running'",
        run_at="now() - interval '2 hours'",
        lease_expires_at="now() + interval '1 minute'",
    )
    await job(conn, type="'t'", queue="'q2'", run_at="now() - interval '5 seconds'")
    await job(conn, type="'t'", queue="'q3'", run_at="now() + interval '1 minute'")
    rows = {r["queue"]: r for r in await conn.fetch("SELECT * FROM pgworker.queue_backlog")}
    assert set(rows) == {"q1", "q2"}
    assert rows["q1"]["pending_due"] == 2 and rows["q2"]["pending_due"] == 1
    assert 59 <= rows["q1"]["oldest_age"].total_seconds() < 70
    assert 4 <= rows["q2"]["oldest_age"].total_seconds() < 15
    assert rows["q1"]["oldest_run_at"] is not None


async def test_worker_activity_lists_workers_with_their_running_jobs(conn):
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency, "
        "last_seen_at) VALUES ('w1', 'h1', 1, '{default}', '{t}', 4, now() - interval '5 seconds'),"
        " ('w2', 'h2', 2, '{default}', '{}', 2, now())"
    )
    running = "now() + interval '1 minute'"
    one = await job(
        conn, type="'t'", status="'running'", worker_id="'w1'", lease_expires_at=running
    )
    two = await job(
        conn, type="'t'", status="'running'", worker_id="'w1'", lease_expires_at=running
    )
    await job(conn, type="'t'", status="'completed'", worker_id="'w1'", finished_at="now()")
    await job(conn, type="'t'", status="'running'", worker_id="'gone'", lease_expires_at=running)
    rows = {r["worker_id"]: r for r in await conn.fetch("SELECT * FROM pgworker.worker_activity")}
    assert set(rows) == {"w1", "w2"}
    assert rows["w1"]["running_job_ids"] == [one, two] and rows["w2"]["running_job_ids"] == []
    assert (rows["w1"]["hostname"], rows["w1"]["pid"], rows["w1"]["concurrency"]) == ("h1", 1, 4)
    assert 4 <= rows["w1"]["seen_ago"].total_seconds() < 15
    assert rows["w2"]["last_seen_at"] is not None


def views_section() -> str:
    return section(page("operations/monitoring.md"), "## Dashboard views")


async def test_the_docs_document_every_view_and_column(conn):
    said = views_section()
    for view in VIEWS:
        columns = await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'pgworker' AND table_name = $1",
            view,
        )
        assert columns, view
        assert f"`pgworker.{view}`" in said, view
        for c in columns:
            assert re.search(rf"`{c['column_name']}`", said), (view, c["column_name"])


# A million attempts over 30 days, in time order (as a worker writes them, which the BRIN on
# started_at needs); the last hour holds about 1,400 of them.
ATTEMPTS = """
INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                   outcome, started_at, finished_at, error_message)
SELECT g, 1, 'type' || (g % 20), 'q' || (g % 5), 'w' || (g % 10), 'c' || g,
       CASE WHEN g > 999990 THEN 'running' WHEN g % 10 = 0 THEN 'failed'
            WHEN g % 10 = 1 THEN 'retried' WHEN g % 23 = 0 THEN 'timed_out' ELSE 'completed' END,
       now() - (1000000 - g) * interval '2.592 seconds',
       CASE WHEN g <= 999990
            THEN now() - (1000000 - g) * interval '2.592 seconds' + (g % 100) * interval '10 ms'
       END,
       CASE WHEN g % 10 = 0 THEN 'boom' END
FROM generate_series(1, 1000000) AS g
"""

# 50,000 jobs: 42,000 finished (one in 20 failed) over 29 days, 5,000 pending and due, 2,000
# pending later, 1,000 running on ten workers, 50 of them past their lease.
JOBS = """
INSERT INTO pgworker.jobs (type, queue, status, attempts, error, run_at, worker_id,
                           lease_expires_at, claimed_at, finished_at)
SELECT 'type' || (g % 20), 'q' || (g % 5),
       CASE WHEN g <= 42000 THEN (CASE WHEN g % 20 = 0 THEN 'failed' ELSE 'completed' END)
            WHEN g <= 49000 THEN 'pending' ELSE 'running' END,
       CASE WHEN g <= 42000 OR g > 49000 THEN 1 ELSE 0 END,
       CASE WHEN g <= 42000 AND g % 20 = 0 THEN 'boom ' || g END,
       CASE WHEN g <= 42000 THEN now() - (42000 - g) * interval '1 minute'
            WHEN g <= 47000 THEN now() - (47000 - g) * interval '1 second'
            WHEN g <= 49000 THEN now() + g * interval '1 second'
            ELSE now() - interval '1 minute' END,
       CASE WHEN g > 49000 THEN 'w' || (g % 10) END,
       CASE WHEN g > 49950 THEN now() - interval '5 minutes'
            WHEN g > 49000 THEN now() + interval '1 minute' END,
       CASE WHEN g > 49000 THEN now() - interval '1 minute' END,
       CASE WHEN g <= 42000 THEN now() - (42000 - g) * interval '1 minute' END
FROM generate_series(1, 50000) AS g;
INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency)
SELECT 'w' || g, 'h' || g, g, '{default}', '{}', 100 FROM generate_series(0, 9) AS g
"""

# The index each view must read through, and the rows it returns over the data above.
EXPECTED = {
    "type_stats": ("job_attempts_started_idx", 20),
    "recent_failures": ("jobs_finished_idx", 100),
    "overdue_jobs": ("jobs_lease_idx", 50),
    "queue_backlog": ("jobs_claim_type_idx", 5),
    "worker_activity": ("jobs_lease_idx", 10),
}


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


async def test_each_view_scans_an_index_in_under_50_ms_over_a_million_attempts(conn):
    began = time.monotonic()
    await conn.execute(ATTEMPTS)
    await conn.execute(JOBS)
    for table in ("jobs", "job_attempts", "workers"):
        await conn.execute(f"VACUUM ANALYZE pgworker.{table}")
    timings = {}
    for view, (index, count) in EXPECTED.items():
        assert len(await conn.fetch(f"SELECT * FROM pgworker.{view}")) == count, view
        best = float("inf")
        for _ in range(3):
            explained = await conn.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT * FROM pgworker.{view}"
            )
            plan = json.loads(explained)[0]
            best = min(best, plan["Execution Time"])
        nodes = plan_nodes(plan["Plan"])
        seq = [n for n in nodes if n["Node Type"] == "Seq Scan"]
        assert not [n for n in seq if n["Relation Name"] in ("jobs", "job_attempts")], (view, plan)
        assert index in {n.get("Index Name") for n in nodes}, (view, plan)
        assert best < 50, (view, best, plan)
        timings[view] = round(best, 2)
    print("execution ms:", timings)
    assert time.monotonic() - began < 60
