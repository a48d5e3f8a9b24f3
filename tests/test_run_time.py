"""One word for one thing: an attempt's run time is the handler's, one number
named `run_ms` in the worker's log line, in job_attempts, in `pgworker show` and on the
dashboard ("run time"); the wait (the claim's time past the job's run_at) is shown beside it,
apart. A state's friendly word keeps its technical status beside it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker._web.dashboard_words import span, state

from .helpers import cli, has_status, logged, wait_for
from .test_operators import _dashboard
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

SLEEP = 0.3


async def test_one_run_time_in_the_log_the_table_the_cli_and_the_dashboard(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("slow")
    async def slow(ctx: pgworker.JobContext, payload: Any) -> None:
        await asyncio.sleep(SLEEP)  # the handler's own time, what run_ms measures

    late = datetime.now(UTC) - timedelta(seconds=5)
    job = (await pgworker.enqueue(conn, "slow", {}, run_at=late)).job.id
    with capture_logs() as logs:
        async with pgworker.Worker(registry, dsn, poll_interval=0.1):
            await wait_for(lambda: has_status(conn, job, "completed"), timeout=30)
    row = await conn.fetchrow(
        "SELECT run_ms, wait_ms, extract(epoch FROM finished_at - started_at) * 1000 AS span "
        "FROM pgworker.job_attempts WHERE job_id = $1",
        job,
    )
    [line] = logged(logs, "job completed", job_id=job)
    assert "duration_ms" not in line
    # the same number in the log and the table (the table keeps it as `real`)
    assert line["run_ms"] == pytest.approx(row["run_ms"], abs=0.05)
    assert SLEEP * 1000 <= row["run_ms"] < SLEEP * 1000 + 250
    assert row["run_ms"] <= row["span"]  # not the claim-to-write span
    assert 5000 <= row["wait_ms"] < 15000  # waited ~5 s past its run_at, shown apart

    shown = cli("show", str(job), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert f"run time {row['run_ms']:.1f} ms" in shown.stdout
    assert f"wait {row['wait_ms']:.1f} ms" in shown.stdout

    async with serving(dsn) as served, _dashboard(served, served.token) as client:
        page = (await client.get(f"/ui/jobs/{job}")).text
        assert f"run time {span(row['run_ms'] / 1000)}" in page
        assert f"wait {span(row['wait_ms'] / 1000)}" in page
        assert "took" not in page
        assert "done · completed" in page


async def test_each_word_keeps_its_status_beside_it():
    now = datetime.now(UTC)
    said = {
        s: state({"status": s, "run_at": now - timedelta(seconds=1)}, now).text
        for s in ("pending", "running", "failed", "completed", "cancelled")
    }
    assert said == {
        "pending": "received — waiting for a worker · pending",
        "running": "in progress · running",
        "failed": "needs attention · failed",
        "completed": "done · completed",
        "cancelled": "cancelled",
    }
    assert state({"status": "pending", "error": "E: x"}).text == (
        "in progress — retrying after an error · pending"
    )
    assert span(0.0002) == "0.2 ms" and span(0.021) == "21 ms"
