"""The recipes of the documentation (examples/recipes/) against a real PostgreSQL, and its promise
that its code is the recipes' code and its references resolve inside the repository."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import pgworker
from examples.recipes import cancel, drain, fastapi_lifespan, retry
from examples.recipes.tasks import registry

from .docs import all_blocks, rendered
from .helpers import wait_for
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "examples" / "recipes"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


async def status_of(conn: Any, job_id: int) -> str:
    return await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", job_id)


async def outcomes(conn: Any, job_id: int) -> list[str]:
    rows = await conn.fetch(
        "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt", job_id
    )
    return [r["outcome"] for r in rows]


def statements(path: Path) -> list[str]:
    """The SQL statements of a recipe file, comments left out."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def start_worker(dsn: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """A real `pgworker run examples.recipes.tasks`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "pgworker", "run", "examples.recipes.tasks", "--dsn", dsn, *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=env,
        cwd=ROOT,
    )


# The documentation


async def test_doc_code_blocks_are_the_recipes_code():
    """A block of the README or the site whose first line names a recipe file
    (`# examples/recipes/x.py`) is that file's text, verbatim."""
    checked = 0
    for block in all_blocks():
        named = re.fullmatch(r"(?:#|--) (examples/recipes/\S+)", block.first_line)
        if named is None:
            continue
        said = (ROOT / named[1]).read_text()
        assert block.rest.strip() in said, f"{block} differs from {named[1]}"
        checked += 1
    assert checked >= 5


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", rendered(path), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


async def test_every_reference_resolves_inside_the_repository():
    """Links and file paths in the README and docs/ name files that exist, and their anchors
    headings that exist; nothing cites a document users do not have."""
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            assert path.exists(), f"{doc.name}: link to {target} (no such file)"
            if anchor:
                assert anchor in _anchors(path), f"{doc.name}: link to {target} (no such heading)"
        for path in re.findall(r"`((?:examples|docs|sql|bench|tests|pgworker)/[^`\s<]*)`", text):
            if path.startswith("bench/results/"):  # written by `make bench`, not committed
                continue
            assert list(ROOT.glob(path.rstrip("/"))), f"{doc.name}: `{path}` does not exist"
        assert "DESIGN" not in text, f"{doc.name} cites a design document users do not have"


# Retry a failed job


def _flaky_registry() -> pgworker.Registry:
    tasks = pgworker.Registry()

    @tasks.task("flaky", max_retries=0)
    async def flaky(ctx: pgworker.JobContext, payload: dict) -> dict:
        if ctx.attempt == 1:
            raise RuntimeError("upstream down")
        return {"attempt": ctx.attempt}

    return tasks


async def test_retry_job_runs_a_failed_job_again_at_once_keeping_its_history(dsn, conn):
    job = (await pgworker.enqueue(conn, "flaky", {})).job
    # A poll interval longer than the test: only the recipe's notification wakes the worker.
    async with pgworker.Worker(_flaky_registry(), dsn, poll_interval=3600):
        await wait_for(lambda: _is(conn, job.id, "failed"))
        assert await retry.retry_job(conn, job.id)
        await wait_for(lambda: _is(conn, job.id, "completed"))
        assert not await retry.retry_job(conn, job.id)  # only a failed job is retried
    done = await pgworker.get_job(conn, job.id)
    assert (done.result, done.attempts, done.retry_count) == ({"attempt": 2}, 2, 0)
    assert await outcomes(conn, job.id) == ["failed", "completed"]


async def _is(conn: Any, job_id: int, status: str) -> bool:
    return await status_of(conn, job_id) == status


async def test_replay_failed_runs_every_failed_job_of_a_type_again(dsn, conn):
    jobs = [(await pgworker.enqueue(conn, "flaky", {"n": n})).job.id for n in range(3)]
    other = (await pgworker.enqueue(conn, "flaky", {}, queue="elsewhere")).job.id
    async with pgworker.Worker(_flaky_registry(), dsn, poll_interval=3600):
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 3 FROM pgworker.jobs WHERE status = 'failed'")
        )
        assert await retry.replay_failed(conn, "flaky") == 3
        assert await retry.replay_failed(conn, "no-such-type") == 0
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 3 FROM pgworker.jobs WHERE status = 'completed'"
            )
        )
    for job_id in jobs:
        assert await outcomes(conn, job_id) == ["failed", "completed"]
    assert await status_of(conn, other) == "pending"  # a queue this worker does not serve


# Cancel a job


async def test_cancel_a_pending_a_running_and_a_finished_job(dsn, conn):
    pending = (await pgworker.enqueue(conn, "build-report", {"name": "q1"}, delay=3600)).job.id
    job = await cancel.cancel_and_wait(conn, pending)
    assert (job.status, job.error) == ("cancelled", "Cancelled: cancelled by an operator")
    assert await outcomes(conn, pending) == []

    running = (await pgworker.enqueue(conn, "build-report", {"name": "q2", "seconds": 60})).job
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: _is(conn, running.id, "running"))
        started = time.monotonic()
        with anyio.fail_after(10):
            job = await cancel.cancel_and_wait(conn, running.id)
        assert time.monotonic() - started < 5
    assert (job.status, job.retry_count) == ("cancelled", 0)
    assert await outcomes(conn, running.id) == ["cancelled"]

    again = await pgworker.cancel(conn, running.id)
    assert isinstance(again, pgworker.CancelResult) and again == "already cancelled"
    with pytest.raises(pgworker.ValidationError):
        await pgworker.cancel(conn, 10**12)


async def test_cancelling_a_completed_job_changes_nothing(dsn, conn):
    job = (await pgworker.enqueue(conn, "send-email", {"to": "ada@example.org"})).job
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: _is(conn, job.id, "completed"))
    assert await pgworker.cancel(conn, job.id) == "already completed"
    done = await cancel.cancel_and_wait(conn, job.id)
    assert (done.status, done.result) == ("completed", {"sent_to": "ada@example.org"})


# Find failures, and what to monitor


async def test_find_failures_queries(dsn, conn):
    bad = (await pgworker.enqueue(conn, "send-email", {"to": "nobody"})).job.id
    good = (await pgworker.enqueue(conn, "send-email", {"to": "ada@example.org"})).job.id
    async with pgworker.Worker(registry, dsn):
        await wait_for(lambda: _is(conn, bad, "failed"))
        await wait_for(lambda: _is(conn, good, "completed"))
    failed, errors, history = statements(RECIPES / "find_failures.sql")
    rows = await conn.fetch(failed)
    assert [(r["id"], r["error"]) for r in rows] == [
        (bad, "PermanentError: not an address: 'nobody'")
    ]
    rows = await conn.fetch(errors)
    assert [(r["type"], r["outcome"], r["error_type"], r["attempts"]) for r in rows] == [
        ("send-email", "failed", "PermanentError", 1)
    ]
    assert "job_id = 42" in history
    rows = await conn.fetch(history.replace("job_id = 42", f"job_id = {bad}"))
    assert [(r["attempt"], r["outcome"], r["error_message"]) for r in rows] == [
        (1, "failed", "not an address: 'nobody'")
    ]


async def test_monitoring_queries(dsn, conn):
    await pgworker.enqueue(conn, "send-email", {"to": "nobody"})
    await pgworker.enqueue(conn, "send-email", {"to": "ada@example.org"})
    waiting = (await pgworker.enqueue(conn, "build-report", {"name": "r"}, queue="idle")).job
    async with pgworker.Worker(registry, dsn):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 2 FROM pgworker.jobs WHERE status IN ('completed', 'failed')"
            )
        )
    backlog, failure_rate, slowest = statements(RECIPES / "monitor.sql")
    assert [(r["queue"], r["count"]) for r in await conn.fetch(backlog)] == [(waiting.queue, 1)]
    assert [(r["type"], r["bad"], r["attempts"]) for r in await conn.fetch(failure_rate)] == [
        ("send-email", 1, 2)
    ]
    rows = await conn.fetch(slowest)
    assert [r["type"] for r in rows] == ["send-email"] and rows[0]["p95"].total_seconds() >= 0


# A worker in a FastAPI application's lifespan


async def test_fastapi_lifespan_serves_while_the_application_runs(dsn, conn, monkeypatch):
    monkeypatch.setenv("PGWORKER_DSN", dsn)
    async with fastapi_lifespan.lifespan(None):
        job = (await pgworker.enqueue(conn, "send-email", {"to": "ada@example.org"})).job
        await wait_for(lambda: _is(conn, job.id, "completed"))
        assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 1
    assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0
    assert (await pgworker.get_job(conn, job.id)).result == {"sent_to": "ada@example.org"}


async def test_fastapi_lifespan_hands_running_jobs_back_when_the_application_stops(
    dsn, conn, monkeypatch
):
    monkeypatch.setenv("PGWORKER_DSN", dsn)
    job = (await pgworker.enqueue(conn, "build-report", {"name": "r", "seconds": 60})).job
    # The default grace is 30 s: the test gives running jobs half a second.
    monkeypatch.setattr(
        pgworker, "Worker", functools.partial(pgworker.Worker, shutdown_timeout=0.5)
    )
    async with fastapi_lifespan.lifespan(None):
        await wait_for(lambda: _is(conn, job.id, "running"))
    back = await pgworker.get_job(conn, job.id)
    assert (back.status, back.retry_count) == ("pending", 0)
    assert await outcomes(conn, job.id) == ["interrupted"]


# Drain a queue before a deploy


async def test_drain_waits_until_the_queue_has_nothing_pending_or_running(dsn, conn, tmp_path):
    jobs = [
        (await registry.enqueue(conn, "build-report", {"name": f"r{n}", "seconds": 0.5})).job.id
        for n in range(4)
    ]  # registry.enqueue: the task's queue, reports
    other = (await pgworker.enqueue(conn, "build-report", {"name": "x"}, queue="idle")).job.id
    assert drain.main(["reports", "--dsn", dsn, "--timeout", "0.3", "--every", "0.1"]) == 1
    worker = start_worker(dsn, tmp_path / "worker.log", "--concurrency", "2")
    try:
        code = await anyio.to_thread.run_sync(
            drain.main, ["reports", "--dsn", dsn, "--timeout", "60", "--every", "0.1"]
        )
        assert code == 0
        for job_id in jobs:
            assert await status_of(conn, job_id) == "completed"
        assert await status_of(conn, other) == "pending"  # another queue is not waited for
        worker.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30)) == 0
    finally:
        worker.kill()
    assert drain.main(["no-such-queue", "--dsn", dsn, "--timeout", "0"]) == 0
    assert drain.main(["reports", "--dsn", "postgresql://nobody@127.0.0.1:1/none"]) == 2


async def test_sigterm_lets_short_jobs_finish_and_hands_long_ones_back(dsn, conn, tmp_path):
    short = (await pgworker.enqueue(conn, "build-report", {"name": "s", "seconds": 0.5})).job.id
    long = (await pgworker.enqueue(conn, "build-report", {"name": "l", "seconds": 60})).job.id
    worker = start_worker(dsn, tmp_path / "worker.log", "--shutdown-timeout", "2")
    try:
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 2 FROM pgworker.jobs WHERE status = 'running'")
        )
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30)) == 0
        assert time.monotonic() - started < 10
    finally:
        worker.kill()
    assert await status_of(conn, short) == "completed"
    back = await pgworker.get_job(conn, long)
    assert (back.status, back.retry_count) == ("pending", 0)
    assert await outcomes(conn, long) == ["interrupted"]


# Logs of an embedded worker (README, Worker in code)

EMBEDDED = """
import asyncio, logging, sys
import asyncpg, pgworker

if sys.argv[2] == "info":  # the README's two lines
    logging.basicConfig()  # a handler
    logging.getLogger("pgworker").setLevel(logging.INFO)
elif sys.argv[2] == "fields":  # the job's fields, as attributes of the records
    shown = "%(levelname)s %(message)s %(job_id)s %(attempt)s %(correlation_id)s %(worker_id)s"
    handler = logging.StreamHandler()
    fields = dict.fromkeys(["job_id", "attempt", "correlation_id", "worker_id"], "-")
    handler.setFormatter(logging.Formatter(shown, defaults=fields))
    logging.getLogger("pgworker").addHandler(handler)
    logging.getLogger("pgworker").setLevel(logging.INFO)

registry = pgworker.Registry()


@registry.task("ok")
async def ok(ctx, payload):
    return None


@registry.task("bad", max_retries=0)
async def bad(ctx, payload):
    raise ValueError("boom")


async def main(dsn):
    conn = await asyncpg.connect(dsn)
    jobs = [
        (await pgworker.enqueue(conn, t, {}, correlation_id=f"req-{t}")).job.id
        for t in ("ok", "bad")
    ]
    async with pgworker.Worker(registry, dsn, worker_id="w1"):
        while await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        ):
            await asyncio.sleep(0.05)
    print(*jobs)


asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("configured", ["nothing", "info", "fields"])
async def test_an_embedded_worker_logs_through_the_pgworker_logger(dsn, tmp_path, configured):
    script = tmp_path / "embedded.py"
    script.write_text(EMBEDDED)
    done = await anyio.run_process([sys.executable, str(script), dsn, configured], check=False)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    ok, bad = out.split()
    if configured == "nothing":  # WARNING and above only: nothing per job
        assert err == ""
    elif configured == "info":
        lines = err.splitlines()
        assert "INFO:pgworker:job completed" in lines and "INFO:pgworker:job failed" in lines
        assert "job started" not in err  # DEBUG
        assert "Traceback" not in err
    else:
        lines = err.splitlines()
        assert f"INFO job completed {ok} 1 req-ok w1" in lines
        assert f"INFO job failed {bad} 1 req-bad w1" in lines
        assert "job started" not in err and "Traceback" not in err


# examples/recipes/http_worker.sh


async def _run_http_worker(url: str, token: str) -> Any:
    env = {"PGWORKER_URL": url, "PGWORKER_API_TOKEN": token, "PATH": os.environ["PATH"]}
    with anyio.fail_after(60):
        return await anyio.run_process(
            ["bash", str(RECIPES / "http_worker.sh")], env=env, check=False
        )


async def test_the_http_worker_works_one_job_then_stops_cleanly_when_nothing_is_due(dsn, conn):
    """With one job: claimed, renewed, completed and read. Run again, its job (the same
    idempotency key) is done and the claim answers 204: the script says so and exits 0, where it
    posted to /jobs//heartbeat and failed."""
    if not (shutil.which("curl") and shutil.which("jq")):
        pytest.skip("needs curl (7.82+, for --json) and jq")
    async with serving(dsn) as served:
        first = await _run_http_worker(served.url, served.token)
        assert first.returncode == 0, first.stderr.decode()
        job = await conn.fetchrow("SELECT id, status, attempts, result::text FROM pgworker.jobs")
        assert (job["status"], job["attempts"]) == ("completed", 1)
        assert json.loads(job["result"]) == {"sent": True}
        assert b'"attempt_history"' in first.stdout and b'"queues"' in first.stdout

        again = await _run_http_worker(served.url, served.token)
        assert again.returncode == 0, again.stderr.decode()
        assert "nothing to claim" in again.stderr.decode()
        assert b'"attempt_history"' not in again.stdout  # it stopped after the claim
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1
        assert await conn.fetchval("SELECT attempts FROM pgworker.jobs") == 1
        assert "Traceback" not in served.stderr()
