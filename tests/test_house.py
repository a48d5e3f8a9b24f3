"""The shape of the package: its public names, its layers and no import circle, one definition of
each piece of knowledge (the job row, the retry rule, the fingerprint, the statements), and the SQL
files found from a wheel."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import pgworker
from pgworker import Job, RetryPolicy
from pgworker._db import files
from pgworker._db.queries import Queries
from pgworker._version import DISTRIBUTION
from pgworker.models import JOB_FIELDS
from pgworker.retry import next_retry

from .helpers import fake_claim, has_status, serving_guarded, wait_for

REPO = Path(__file__).resolve().parent.parent
aio = pytest.mark.asyncio(loop_scope="session")

PUBLIC = {
    "PRIORITY_LABELS",
    "CancelResult",
    "ConfigError",
    "DatabaseUnavailable",
    "EnqueueResult",
    "FailedJob",
    "FailureGroup",
    "IdempotencyConflict",
    "Job",
    "JobContext",
    "JobNotPending",
    "JobSpec",
    "JobStatus",
    "PeriodicSchedule",
    "PermanentError",
    "PgWorkerError",
    "PrivilegeError",
    "QueueState",
    "Registry",
    "ReplayResult",
    "Retry",
    "RetryPolicy",
    "SchemaError",
    "Settings",
    "Snooze",
    "Task",
    "TaskHandle",
    "ValidationError",
    "Worker",
    "__version__",
    "cancel",
    "configure_logging",
    "enqueue",
    "enqueue_many",
    "failure_groups",
    "get_job",
    "list_failed",
    "list_periodic",
    "list_queues",
    "limit_queue",
    "migrate",
    "pause_queue",
    "prune",
    "replay",
    "resume_queue",
    "update_job",
    "emit",
    "wait",
    "sync",
}
PUBLIC_MODULES = {
    "cli",
    "context",
    "enqueue",
    "errors",
    "models",
    "operations",
    "registry",
    "retry",
    "settings",
    "testing",
    "sync",
    "web",
    "worker",
}


def test_the_public_names_are_exactly_these():
    assert set(pgworker.__all__) == PUBLIC
    for name in pgworker.__all__:
        assert getattr(pgworker, name) is not None
    assert "AttemptResult" not in pgworker.__all__ and "Outcome" not in pgworker.__all__


def test_internal_modules_are_private():
    names = {p.stem for p in (REPO / "pgworker").glob("*.py")} - {"__init__", "__main__"}
    packages = {
        p.name
        for p in (REPO / "pgworker").iterdir()
        if p.is_dir() and p.name not in {"sql", "__pycache__"}
    }
    assert {n for n in names | packages if not n.startswith("_")} == PUBLIC_MODULES
    cli = {p.stem for p in (REPO / "pgworker" / "cli").glob("*.py")} - {"__init__", "__main__"}
    assert all(n.startswith("_") for n in cli), cli
    assert not (REPO / "pgworker" / "devdb.py").exists()


def test_init_holds_no_logic():
    source = (REPO / "pgworker" / "__init__.py").read_text()
    assert "def " not in source and "class " not in source


def test_version_comes_from_the_package_metadata():
    assert pgworker.__version__ == importlib.metadata.version(DISTRIBUTION)


@aio
async def test_cancel_returns_a_str_enum_equal_to_the_old_strings(conn):
    r = await pgworker.enqueue(conn, "t", {})
    outcome = await pgworker.cancel(conn, r.job.id)
    assert isinstance(outcome, pgworker.CancelResult)
    assert outcome == "cancelled" and outcome is pgworker.CancelResult.CANCELLED
    again = await pgworker.cancel(conn, r.job.id)
    assert again == "already cancelled" and f"{again}" == "already cancelled"


def test_the_layers_hold_and_no_import_runs_in_a_circle():
    """The contracts of pyproject's [tool.importlinter] (`make lint` runs the same): each module in
    its layer, importing only what lies below it, and no circle, function-level imports and
    imports for type checking counted."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout, done.stdout


# --- one definition of each piece of knowledge ------------------------------------------------


def test_every_sql_file_has_its_method_and_every_method_its_file():
    stems = {p.stem for p in (REPO / "sql" / "queries").glob("*.sql") if not p.stem.startswith("_")}
    methods = {
        name
        for name, value in vars(Queries).items()
        if callable(value) and not name.startswith("_")
    }
    assert stems <= methods
    assert methods - stems == {"jobs_copy"}  # COPY is a protocol message, not a statement


@aio
async def test_the_job_row_is_read_by_name_from_the_one_column_list(conn):
    """Job's fields are the columns every statement reads; a field with no column (or a column
    renamed) breaks here, not in a mis-assigned value."""
    columns = {
        r["column_name"]
        for r in await conn.fetch(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = 'pgworker' AND table_name = 'jobs'"
        )
    }
    fields = [f.name for f in dataclasses.fields(Job) if f.metadata.get("column", True)]
    assert set(fields) <= columns
    assert list(JOB_FIELDS) == fields
    listed = [c.split(" AS ")[-1].removeprefix("j.") for c in files.job_columns().split(", ")]
    assert listed == fields
    r = await pgworker.enqueue(conn, "t", {"a": 1}, queue="q", priority=7, idempotency_key="k")
    assert await pgworker.get_job(conn, r.job.id) == r.job


@aio
async def test_the_claim_returns_whole_jobs(dsn, conn):
    r = await pgworker.enqueue(conn, "seen", {"x": 1})
    registry = pgworker.Registry()
    seen: list[Job] = []

    @registry.task("seen")
    async def handler(ctx, payload):
        seen.append(ctx.job)

    async with serving_guarded(registry, dsn):
        await wait_for(lambda: seen)
    job = seen[0]
    assert (job.id, job.status, job.attempts, job.payload) == (r.job.id, "running", 1, {"x": 1})
    assert job.worker_id and job.claimed_at and job.lease_expires_at > job.claimed_at


@aio
async def test_one_fingerprint_function_for_every_statement(conn):
    payload = {"b": [1, 2], "a": "é"}
    one = await pgworker.enqueue(conn, "t", payload, idempotency_key="one")
    [many] = await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("t", payload, idempotency_key="two", delay=0)]
    )
    rows = await conn.fetch(
        "SELECT fingerprint, pgworker.fingerprint(type, payload) AS expected FROM pgworker.jobs "
        "WHERE id = ANY($1::bigint[])",
        [one.job.id, many.job.id],
    )
    assert len(rows) == 2 and all(r["fingerprint"] == r["expected"] for r in rows)
    # What versions before migration 5 computed inline: their running workers agree with it.
    assert await conn.fetchval(
        "SELECT pgworker.fingerprint('t', $1::jsonb) = md5('t' || chr(31) || $1::jsonb::text)",
        '{"b": [1, 2], "a": "é"}',
    )
    statements = files.queries("pgworker")  # as sent: their fragments placed
    for name in ("job_insert", "job_insert_many"):
        assert '"pgworker".fingerprint(' in statements[name] and "md5" not in statements[name]
    # Since migration 10 a key's job is matched by one function too, on JSON values.
    for name in ("job_insert", "job_get_by_keys"):
        text = statements[name]
        assert '"pgworker".same_work(j.type, j.payload, ' in text and "j.fingerprint" not in text
    for migration in ("0010_idempotency_values", "0016_enqueue_concurrency_key"):
        function = (REPO / "sql" / "migrations" / f"{migration}.sql").read_text()
        assert "{schema}.same_work(j.type, j.payload, v_type, v_payload)" in function


def test_the_retry_rule_retries_while_retries_remain_then_fails():
    policy = RetryPolicy(max_retries=2, initial_delay=10, max_delay=15, jitter=0)
    assert next_retry(policy, 0, None) == 10
    assert next_retry(policy, 1, None) == 15  # 20, capped
    assert next_retry(policy, 2, None) is None
    assert next_retry(policy, 2, 5) == 15  # the job's own max_retries wins
    assert next_retry(policy, 0, 0) is None
    assert next_retry(policy, 0, None, after=3.5) == 3.5
    assert next_retry(policy, 0, None, after=float("nan")) == 0.0
    assert next_retry(policy, 0, None, after=1e13) == pgworker._validate.MAX_DELAY
    jittered = RetryPolicy(initial_delay=10, jitter=0.5)
    rand = random.Random(1)
    for _ in range(100):
        delay = next_retry(jittered, 0, None)
        assert delay is not None and 5 <= delay <= 15
        assert 5 <= jittered.delay(1, rand) <= 15


@aio
async def test_a_rescued_job_waits_for_its_backoff(dsn, conn):
    """The rescue applies the same rule as a failed attempt: a lost job that is retried runs
    again after its task's backoff, not at once; one out of retries fails."""
    registry = pgworker.Registry()

    @registry.task("slow-retry", retry=RetryPolicy(initial_delay=600, max_delay=600, jitter=0))
    async def handler(ctx, payload):
        return None

    retried = await pgworker.enqueue(conn, "slow-retry", {})
    spent = await pgworker.enqueue(conn, "slow-retry", {}, max_retries=0)
    for r in (retried, spent):
        await fake_claim(conn, r.job.id)
    before = datetime.now(UTC)
    async with serving_guarded(registry, dsn, lease=1):
        await wait_for(lambda: has_status(conn, retried.job.id, "pending"))
        await wait_for(lambda: has_status(conn, spent.job.id, "failed"))
    job = await pgworker.get_job(conn, retried.job.id)
    assert job.retry_count == 1 and job.error.startswith("WorkerLost")
    assert before + timedelta(seconds=590) < job.run_at < before + timedelta(seconds=700)
    outcomes = await conn.fetch(
        "SELECT outcome FROM pgworker.job_attempts WHERE job_id = ANY($1::bigint[])",
        [retried.job.id, spent.job.id],
    )
    assert [r["outcome"] for r in outcomes] == ["lost", "lost"]


@aio
async def test_a_lost_job_past_its_retry_budget_fails_at_its_rescue(dsn, conn):
    """The rescue applies the whole rule: with retries left but its max_elapsed spent, a job
    whose worker was lost fails; one within its budget is retried."""
    registry = pgworker.Registry()
    policy = RetryPolicy(max_retries=100, initial_delay=600, max_delay=600, max_elapsed=60)

    @registry.task("budgeted", retry=policy)
    async def handler(ctx, payload):
        return None

    spent = await pgworker.enqueue(conn, "budgeted", {})
    fresh = await pgworker.enqueue(conn, "budgeted", {})
    for r in (spent, fresh):
        await fake_claim(conn, r.job.id)
    await conn.execute(
        "UPDATE pgworker.jobs SET budget_started_at = now() - make_interval(secs => $2) "
        "WHERE id = $1",
        spent.job.id,
        120.0,
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET budget_started_at = now() WHERE id = $1", fresh.job.id
    )
    async with serving_guarded(registry, dsn, lease=1):
        await wait_for(lambda: has_status(conn, spent.job.id, "failed"))
        await wait_for(lambda: has_status(conn, fresh.job.id, "pending"))
    assert (await pgworker.get_job(conn, spent.job.id)).retry_count == 0


# --- the SQL files travel with the package ------------------------------------------------------


def test_the_sql_files_load_from_a_built_wheel(tmp_path, dsn):
    """One loader for an editable install and a wheel: build the wheel, install it alone in a
    directory, and migrate and enqueue with it."""
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "pgworker" / "sql" / "queries" / "job_claim.sql").is_file()
    assert not (target / "pgworker" / "sql").is_symlink()
    program = f"""
import asyncio, asyncpg, pgworker
from pgworker._db import files
assert pgworker.__file__.startswith({str(target)!r}), pgworker.__file__
assert str(files.sql_dir()).startswith({str(target)!r}), files.sql_dir()
async def main():
    conn = await asyncpg.connect({dsn!r})
    try:
        print(await pgworker.migrate(conn, schema="from_wheel"))
        r = await pgworker.enqueue(conn, "t", {{"n": 1}}, schema="from_wheel")
        print((await pgworker.get_job(conn, r.job.id, schema="from_wheel")).payload)
    finally:
        await conn.execute("DROP SCHEMA IF EXISTS from_wheel CASCADE")
        await conn.close()
asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "{'n': 1}"
    assert done.stdout.splitlines()[0] == str([m.version for m in files.migrations("pgworker")])


@pytest.mark.parametrize("path", ["pgworker/sql"])
def test_the_package_sql_link_points_at_the_repository_sql(path):
    link = REPO / path
    assert link.is_symlink() and link.resolve() == (REPO / "sql").resolve()


def test_an_unknown_worker_option_is_a_config_error_naming_it():
    registry = pgworker.Registry()
    registry.task("t")(lambda ctx, payload: None)
    with pytest.raises(pgworker.ConfigError) as caught:
        pgworker.Worker(registry, "postgresql://x/y", bogus=1)
    assert caught.value.field == "bogus" and "durable_claims" in str(caught.value)
