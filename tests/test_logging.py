"""Logs when embedded: a program that configured nothing sees no line per job; the standard
`logging` logger `pgworker` controls the level and carries the job's fields; the CLI's
`configure_logging` writes JSON lines. Real PostgreSQL, real Workers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

import pgworker
from pgworker import _logs

from .helpers import ROOT, all_finished, wait_for
from .test_cli import cli_env

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()


@registry.task("ok")
async def ok(ctx: pgworker.JobContext, payload: Any) -> Any:
    ctx.log.info("inside the job")  # the handler's own line follows the same rules
    return payload


@registry.task("bad", max_retries=0)
async def bad(ctx: pgworker.JobContext, payload: Any) -> None:
    raise ValueError("boom")


# A program embedding a Worker: it serves the jobs already in the database (the test enqueued
# them) until none is pending or running, then prints `served`. It configures logging only when
# told: `json` calls pgworker.configure_logging, `basic` logging.basicConfig at INFO.
PROGRAM = """
import asyncio, logging, sys
import asyncpg, pgworker

registry = pgworker.Registry()

@registry.task("ok")
async def ok(ctx, payload):
    ctx.log.info("inside the job")
    return payload

@registry.task("bad", max_retries=0)
async def bad(ctx, payload):
    raise ValueError("boom")

@registry.task("unstorable")
async def unstorable(ctx, payload):
    return object()

async def main(dsn, configure):
    if configure == "json":
        pgworker.configure_logging(format="json", level="info")
    elif configure == "basic":
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    conn = await asyncpg.connect(dsn)
    async with pgworker.Worker(registry, dsn, poll_interval=0.05, worker_id="embedded"):
        while await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        ):
            await asyncio.sleep(0.02)
    await conn.close()
    print("served")

asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
"""


def embedded(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, dsn, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=ROOT,
        timeout=60,
    )


async def test_an_embedded_worker_in_a_program_that_configured_nothing_prints_nothing_per_job(
    dsn, conn
):
    for n in range(3):
        await pgworker.enqueue(conn, "ok", {"n": n})
    out = embedded(dsn)
    assert out.returncode == 0, out
    assert (out.stdout, out.stderr) == ("served\n", "")
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'") == 3


async def test_a_failed_job_prints_nothing_either_but_a_warning_still_reaches_stderr(dsn, conn):
    """A job that fails for good is an INFO line like any finished job; the quiet default is
    `logging` without a handler, not a level pgworker lowered or a handler that swallows: a
    warning of pgworker's own (a handler returning what cannot be stored) still reaches stderr,
    as Python's last-resort handler prints it."""
    await pgworker.enqueue(conn, "bad", {})
    await pgworker.enqueue(conn, "unstorable", {})
    out = embedded(dsn)
    assert out.returncode == 0, out
    assert (out.stdout, out.stderr) == ("served\n", "result not stored: not JSON-serialisable\n")


async def test_the_applications_logging_configuration_applies_to_pgworker(dsn, conn):
    """`logging.basicConfig(level=logging.INFO)`: pgworker's per-job lines appear, as any
    library's would, because pgworker lowered or raised no level of its own."""
    for n in range(2):
        await pgworker.enqueue(conn, "ok", {"n": n})
    out = embedded(dsn, "basic")
    assert out.returncode == 0, out
    assert out.stdout == "served\n"
    lines = out.stderr.splitlines()
    assert lines.count("INFO pgworker job completed") == 2, out.stderr
    assert lines.count("INFO pgworker inside the job") == 2, out.stderr
    assert not [line for line in lines if "job started" in line], out.stderr


async def test_configure_logging_json_writes_one_line_per_job_with_its_keys(dsn, conn):
    jobs = [
        (await pgworker.enqueue(conn, "ok", {"n": n}, correlation_id=f"req-{n}")).job.id
        for n in range(2)
    ]
    out = embedded(dsn, "json")
    assert out.returncode == 0, out
    assert out.stdout == "served\n"
    lines = [json.loads(line) for line in out.stderr.splitlines()]  # every line is JSON
    done = [x for x in lines if x["event"] == "job completed"]
    assert sorted(x["job_id"] for x in done) == jobs
    for x in done:
        n = jobs.index(x["job_id"])
        assert (x["attempt"], x["correlation_id"], x["worker_id"]) == (1, f"req-{n}", "embedded")
        assert (x["level"], x["type"], x["status"]) == ("info", "ok", "completed")
        assert "timestamp" in x
    inside = [x for x in lines if x["event"] == "inside the job"]
    assert sorted(x["job_id"] for x in inside) == jobs
    assert not [x for x in lines if x["event"] == "job started"]  # debug, below info


# --- the `logging` route, in this process ------------------------------------------------------


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def unconfigured_structlog() -> Iterator[None]:
    """structlog as in a program that did not configure it (`capture_logs` in an earlier test
    leaves it marked configured); the configuration found is put back after."""
    was_configured = structlog.is_configured()
    config = structlog.get_config()
    structlog.reset_defaults()
    try:
        yield
    finally:
        if was_configured:
            structlog.configure(**config)
        else:
            structlog.reset_defaults()


@pytest.fixture
def pgworker_logger(unconfigured_structlog: None) -> Iterator[tuple[logging.Logger, Records]]:
    logger = logging.getLogger("pgworker")
    handler = Records()
    logger.addHandler(handler)
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


async def serve(dsn: str, conn: Any, jobs: int) -> list[int]:
    ids = [
        (await pgworker.enqueue(conn, "ok", {"n": n}, correlation_id=f"req-{n}")).job.id
        for n in range(jobs)
    ]
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    return ids


def about_jobs(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if hasattr(r, "job_id")]


async def test_the_pgworker_logger_at_info_gets_one_record_per_finished_job(
    dsn, conn, pgworker_logger
):
    logger, handler = pgworker_logger
    logger.setLevel(logging.INFO)
    ids = await serve(dsn, conn, 3)
    pgworker_lines = [r for r in about_jobs(handler.records) if r.getMessage() != "inside the job"]
    assert [r.getMessage() for r in pgworker_lines] == ["job completed"] * 3, pgworker_lines
    assert sorted(r.job_id for r in pgworker_lines) == ids
    for r in pgworker_lines:
        n = ids.index(r.job_id)
        assert (r.levelno, r.name) == (logging.INFO, "pgworker")
        assert (r.attempt, r.correlation_id, r.type) == (1, f"req-{n}", "ok")
        assert r.worker_id and r.status == "completed"
    # the handler's ctx.log line is a record of the same logger, with the same fields
    inside = [r for r in handler.records if r.getMessage() == "inside the job"]
    assert sorted(r.job_id for r in inside) == ids


async def test_the_pgworker_logger_at_warning_gets_no_line_per_job(dsn, conn, pgworker_logger):
    logger, handler = pgworker_logger
    logger.setLevel(logging.WARNING)
    await pgworker.enqueue(conn, "bad", {})
    await serve(dsn, conn, 3)
    assert handler.records == []
    logger.setLevel(logging.INFO)
    failed = (await pgworker.enqueue(conn, "bad", {})).job.id
    await serve(dsn, conn, 1)
    [record] = [r for r in about_jobs(handler.records) if r.getMessage() == "job failed"]
    assert (record.levelno, record.job_id, record.error) == (
        logging.INFO,
        failed,
        "ValueError: boom",
    )


async def test_the_pgworker_logger_at_debug_also_gets_job_started(dsn, conn, pgworker_logger):
    logger, handler = pgworker_logger
    logger.setLevel(logging.DEBUG)
    ids = await serve(dsn, conn, 2)
    started = [r for r in handler.records if r.getMessage() == "job started"]
    assert sorted(r.job_id for r in started) == ids
    assert {(r.levelno, r.attempt) for r in started} == {(logging.DEBUG, 1)}
    completed = [r for r in handler.records if r.getMessage() == "job completed"]
    assert sorted(r.job_id for r in completed) == ids


async def test_fields_named_like_record_attributes_and_format_arguments(pgworker_logger):
    """A handler's ctx.log may pass any field: one named like a LogRecord attribute keeps the
    record intact and arrives with a trailing underscore; %-arguments are formatted by logging;
    the structlog context bound around a job is on the record too."""
    logger, handler = pgworker_logger
    logger.setLevel(logging.INFO)
    log = _logs.get_logger(worker_id="w1")
    structlog.contextvars.bind_contextvars(job_id=7)
    try:
        log.info("saw %s", "it", name="mine", module="m", n=1)
        log.debug("below the level")
    finally:
        structlog.contextvars.clear_contextvars()
    [r] = handler.records
    assert (r.getMessage(), r.name, r.levelno) == ("saw it", "pgworker", logging.INFO)
    assert (r.name_, r.module_, r.n, r.worker_id, r.job_id) == ("mine", "m", 1, "w1", 7)


# --- a handler's bound context ---------------------------------------------------------------


async def test_structlog_context_bound_by_a_handler_does_not_reach_the_next_job(dsn, conn):
    """One slot runs both jobs: what the first binds must be gone when the second starts."""
    registry = pgworker.Registry()
    seen: dict[int, dict] = {}

    @registry.task("t")
    async def handle(ctx, payload):
        seen[ctx.job_id] = structlog.contextvars.get_contextvars()
        structlog.contextvars.bind_contextvars(leaked=ctx.job_id, job_id=-1)

    first = await pgworker.enqueue(conn, "t", {"n": 1}, priority=1)
    second = await pgworker.enqueue(conn, "t", {"n": 2})
    async with pgworker.Worker(registry, dsn, concurrency=1):
        await wait_for(lambda: all_finished(conn))
    assert list(seen) == [first.job.id, second.job.id]
    assert "leaked" not in seen[second.job.id]
    assert (seen[second.job.id]["job_id"], seen[second.job.id]["attempt"]) == (second.job.id, 1)


# --- tracebacks without locals ---------------------------------------------------------------


async def test_a_logged_traceback_never_shows_the_locals_of_its_frames():
    """The console log rendered tracebacks with rich, every frame's locals included: the bearer
    token of the request, the DSN's password, a payload were printed in plain text on stderr."""
    import io

    import structlog

    from pgworker import _logs

    out = io.StringIO()
    secret = "".join(reversed("lacol-a-ni-nekot-terces"))  # not in this file's source lines
    _logs.configure("console", "info", stream=out)
    try:

        def handle(authorization: str) -> None:
            raise RuntimeError("boom")

        try:
            handle(f"Bearer {secret}")
        except RuntimeError:
            structlog.get_logger("t").error("failed", exc_info=True)
    finally:
        _logs.configure("console", "info")
    text = out.getvalue()
    assert "RuntimeError: boom" in text and "in handle" in text
    assert secret not in text
