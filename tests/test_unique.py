"""Unique jobs against the real PostgreSQL: a unique index decides, so 50
concurrent enqueues with one key give one job; the key is free again once the job leaves its
states; a unique period gives one job per bucket; replace=True is a debounce of the pending job
and is refused while it runs; every way in takes the key; bad input names its field and writes
nothing; a replay never collides with the live holder of a key."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import JobSpec

from .helpers import cli, has_status, wait_for
from .test_dashboard import http
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def count(conn: Any) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


async def test_fifty_concurrent_enqueues_give_one_job(dsn):
    conns = [await asyncpg.connect(dsn) for _ in range(50)]
    try:
        results = await asyncio.gather(
            *(
                pgworker.enqueue(c, "refresh-user", {"n": n}, unique_key="refresh-user-7")
                for n, c in enumerate(conns)
            )
        )
        assert sum(r.created for r in results) == 1
        assert len({r.job.id for r in results}) == 1
        assert await count(conns[0]) == 1
        # Whatever the payload: the one job holds the first payload of the winner.
        assert all(r.job.unique_key == "refresh-user-7" for r in results)
    finally:
        for c in conns:
            await c.close()


async def test_the_key_is_per_type_and_queue_and_free_once_the_job_ends(conn):
    first = await pgworker.enqueue(conn, "t", {"a": 1}, unique_key="k")
    again = await pgworker.enqueue(conn, "t", {"a": 2}, unique_key="k")
    assert (first.created, again.created, again.job.id) == (True, False, first.job.id)
    assert again.job.payload == {"a": 1}
    other_type = await pgworker.enqueue(conn, "u", {}, unique_key="k")
    other_queue = await pgworker.enqueue(conn, "t", {}, unique_key="k", queue="q2")
    assert other_type.created and other_queue.created
    # Running: still held.
    await conn.execute("UPDATE pgworker.jobs SET status = 'running' WHERE id = $1", first.job.id)
    assert not (await pgworker.enqueue(conn, "t", {}, unique_key="k")).created
    # Completed: the job left its states, and the index by itself: a new job.
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() WHERE id = $1",
        first.job.id,
    )
    after = await pgworker.enqueue(conn, "t", {"a": 3}, unique_key="k")
    assert after.created and after.job.id != first.job.id


async def test_after_a_real_worker_completes_it_the_next_enqueue_creates_a_new_job(dsn, conn):
    registry = pgworker.Registry()
    done = asyncio.Event()

    @registry.task("refresh")
    async def refresh(ctx: pgworker.JobContext, payload: dict) -> None:
        done.set()

    first = await pgworker.enqueue(conn, "refresh", {}, unique_key="user-7")
    settings = pgworker.Settings(dsn=dsn, poll_interval=0.05)
    async with pgworker.Worker(registry, settings=settings):
        await asyncio.wait_for(done.wait(), 10)
        await wait_for(lambda: has_status(conn, first.job.id, "completed"))
    second = await pgworker.enqueue(conn, "refresh", {}, unique_key="user-7")
    assert second.created and second.job.id != first.job.id


async def test_a_unique_period_gives_one_job_per_bucket(conn):
    """Two enqueues in one transaction share its time, so its bucket: one job. Once the
    database clock passes the next boundary of 2 s, a new transaction makes a new job."""
    async with conn.transaction():
        a = await pgworker.enqueue(conn, "t", {"n": 1}, unique_key="p", unique_period=2)
        b = await pgworker.enqueue(conn, "t", {"n": 2}, unique_key="p", unique_period=2)
        boundary = await conn.fetchval("SELECT (floor(extract(epoch FROM now()) / 2) + 1) * 2")
    assert (a.created, b.created, b.job.id) == (True, False, a.job.id)
    clock = "SELECT extract(epoch FROM clock_timestamp()) >= $1"
    await wait_for(lambda: conn.fetchval(clock, boundary), timeout=5)
    c = await pgworker.enqueue(conn, "t", {"n": 3}, unique_key="p", unique_period=2)
    assert c.created and c.job.id != a.job.id
    buckets = await conn.fetch("SELECT unique_bucket FROM pgworker.jobs ORDER BY id")
    assert (buckets[1][0] - buckets[0][0]).total_seconds() >= 2


async def test_a_final_state_with_a_period_holds_the_key_after_the_job_ends(conn):
    states = ("pending", "running", "completed")
    a = await pgworker.enqueue(
        conn, "t", {}, unique_key="d", unique_states=states, unique_period=3600
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() WHERE id = $1",
        a.job.id,
    )
    b = await pgworker.enqueue(
        conn, "t", {}, unique_key="d", unique_states=states, unique_period=3600
    )
    assert (b.created, b.job.id) == (False, a.job.id)
    # Failed is not one of its states: once failed, the key is free.
    await conn.execute("UPDATE pgworker.jobs SET status = 'failed' WHERE id = $1", a.job.id)
    c = await pgworker.enqueue(
        conn, "t", {}, unique_key="d", unique_states=states, unique_period=3600
    )
    assert c.created


async def test_replace_changes_the_pending_job_and_is_refused_while_it_runs(conn):
    first = await pgworker.enqueue(conn, "t", {"v": 1}, unique_key="r", priority=1, delay=60)
    replaced = await pgworker.enqueue(
        conn, "t", {"v": 2}, unique_key="r", priority=5, delay=600, replace=True
    )
    assert (replaced.created, replaced.job.id) == (False, first.job.id)
    assert (replaced.job.payload, replaced.job.priority) == ({"v": 2}, 5)
    assert (replaced.job.run_at - first.job.run_at).total_seconds() > 500
    stored = await pgworker.get_job(conn, first.job.id)
    assert (stored.payload, stored.priority, stored.run_at) == ({"v": 2}, 5, replaced.job.run_at)
    # Without replace: the job as it is.
    kept = await pgworker.enqueue(conn, "t", {"v": 3}, unique_key="r")
    assert kept.job.payload == {"v": 2}
    await conn.execute("UPDATE pgworker.jobs SET status = 'running' WHERE id = $1", first.job.id)
    before = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", first.job.id)
    with pytest.raises(pgworker.JobNotPending, match="running") as caught:
        await pgworker.enqueue(conn, "t", {"v": 4}, unique_key="r", replace=True)
    assert (caught.value.job_id, caught.value.status) == (first.job.id, "running")
    assert await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", first.job.id) == before
    assert await count(conn) == 1


async def test_replace_keeps_a_parked_jobs_run_at(conn):
    first = await pgworker.enqueue(conn, "t", {"v": 1}, unique_key="park")
    await conn.execute("UPDATE pgworker.jobs SET run_at = 'infinity' WHERE id = $1", first.job.id)
    replaced = await pgworker.enqueue(conn, "t", {"v": 2}, unique_key="park", replace=True)
    assert replaced.job.payload == {"v": 2}
    assert await conn.fetchval(
        "SELECT run_at = 'infinity' FROM pgworker.jobs WHERE id = $1", first.job.id
    )


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"unique_key": ""}, "unique_key", "non-empty"),
    ({"unique_key": "k" * 201}, "unique_key", "at most 200"),
    ({"unique_key": "a\x00b"}, "unique_key", "NUL"),
    ({"unique_key": 7}, "unique_key", "non-empty string"),
    ({"unique_key": "k", "unique_states": ("pending", "runing")}, "unique_states", "unknown"),
    ({"unique_key": "k", "unique_states": "pending"}, "unique_states", "list of states"),
    ({"unique_key": "k", "unique_states": ("pending",)}, "unique_states", "both pending and"),
    (
        {"unique_key": "k", "unique_states": ("pending", "running", "completed")},
        "unique_states",
        "needs a unique_period",
    ),
    ({"unique_key": "k", "unique_period": 0}, "unique_period", "> 0"),
    ({"unique_key": "k", "unique_period": -1}, "unique_period", "> 0"),
    ({"unique_key": "k", "unique_period": "2"}, "unique_period", "number of seconds"),
    ({"unique_key": "k", "unique_period": float("nan")}, "unique_period", "finite"),
    ({"unique_key": "k", "unique_period": 0.0001}, "unique_period", "at least 0.001"),
    ({"replace": True}, "replace", "needs a unique_key"),
    ({"unique_key": "k", "replace": 1}, "replace", "True or False"),
    ({"unique_states": ("pending", "running")}, "unique_states", "needs a unique_key"),
    ({"unique_period": 5}, "unique_period", "needs a unique_key"),
    ({"unique_key": "k", "idempotency_key": "i"}, "unique_key", "not both"),
]


@pytest.mark.parametrize(("given", "field", "says"), BAD, ids=[b[1] + "-" + b[2] for b in BAD])
async def test_bad_input_names_the_field_and_writes_nothing(conn, given, field, says):
    with pytest.raises(pgworker.ValidationError, match=says) as caught:
        await pgworker.enqueue(conn, "t", {}, **given)
    assert caught.value.field == field
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.enqueue_many(
            conn, [JobSpec("t", {}, unique_key="ok"), JobSpec("t", {}, **given)]
        )
    assert caught.value.field == f"specs[1].{field}"
    assert await count(conn) == 0


async def test_enqueue_many_sends_unique_specs_through_the_statement_path(conn):
    specs = [
        JobSpec("t", {"n": 0}),
        JobSpec("t", {"n": 1}, unique_key="m"),
        JobSpec("t", {"n": 2}, unique_key="m"),
        JobSpec("t", {"n": 3}, idempotency_key="i"),
        JobSpec("t", {"n": 4}, unique_key="other"),
    ]
    results = await pgworker.enqueue_many(conn, specs)
    assert [r.created for r in results] == [True, True, False, True, True]
    assert results[2].job.id == results[1].job.id
    assert [r.job.payload["n"] for r in results] == [0, 1, 1, 3, 4]
    assert await count(conn) == 4
    again = await pgworker.enqueue_many(
        conn, [JobSpec("t", {"n": 9}, unique_key="m", replace=True)]
    )
    assert (again[0].created, again[0].job.payload) == (False, {"n": 9})


async def test_task_defaults_give_states_and_period(conn):
    registry = pgworker.Registry()

    @registry.task("digest", unique_states=("pending", "running", "completed"), unique_period=3600)
    async def digest(ctx: pgworker.JobContext, payload: dict) -> None:
        return None

    a = await digest.enqueue(conn, {}, unique_key="u-1")
    await conn.execute("UPDATE pgworker.jobs SET status = 'completed' WHERE id = $1", a.job.id)
    b = await digest.enqueue(conn, {}, unique_key="u-1")
    assert (b.created, b.job.id) == (False, a.job.id)
    row = await conn.fetchrow("SELECT unique_states, unique_bucket FROM pgworker.jobs")
    assert row["unique_states"] == 7
    # Without a key the defaults do nothing.
    assert (await digest.enqueue(conn, {})).created


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_states": ("pending",)}, "unique_states"),
        ({"unique_states": ("pending", "running", "failed")}, "unique_states"),
        ({"unique_period": 0}, "unique_period"),
        ({"unique_period": "x"}, "unique_period"),
    ],
)
async def test_bad_task_defaults_are_a_config_error(options, field):
    registry = pgworker.Registry()
    with pytest.raises(pgworker.ConfigError) as caught:

        @registry.task("bad", **options)
        async def bad(ctx: pgworker.JobContext, payload: dict) -> None:
            return None

    assert caught.value.field == field


async def test_the_sql_function_takes_the_unique_arguments(conn):
    sql = "SELECT * FROM pgworker.enqueue('t', $1::jsonb, unique_key => 'sql-k')"
    a = await conn.fetchrow(sql, '{"n": 1}')
    b = await conn.fetchrow(sql, '{"n": 2}')
    assert (a["created"], b["created"], b["id"]) == (True, False, a["id"])
    replaced = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', '{\"n\": 3}', priority => 4, unique_key => 'sql-k', "
        "replace => true)"
    )
    assert replaced["id"] == a["id"]
    job = await pgworker.get_job(conn, a["id"])
    assert (job.payload, job.priority, job.unique_key) == ({"n": 3}, 4, "sql-k")
    period = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', unique_key => 'sql-p', "
        "unique_states => '{pending,running,failed}', unique_period => '1 hour')"
    )
    assert period["created"]
    assert await conn.fetchval(
        "SELECT unique_bucket = to_timestamp(floor(extract(epoch FROM now()) / 3600) * 3600) "
        "FROM pgworker.jobs WHERE id = $1",
        period["id"],
    )
    # A Python enqueue and the SQL function share the bucket.
    again = await pgworker.enqueue(
        conn,
        "t",
        unique_key="sql-p",
        unique_states=("pending", "running", "failed"),
        unique_period=3600,
    )
    assert (again.created, again.job.id) == (False, period["id"])
    await conn.execute("UPDATE pgworker.jobs SET status = 'running' WHERE id = $1", a["id"])
    with pytest.raises(asyncpg.PostgresError, match="running") as caught:
        await conn.fetchrow(
            "SELECT * FROM pgworker.enqueue('t', unique_key => 'sql-k', replace => true)"
        )
    assert caught.value.sqlstate == "PGW03"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ("unique_key => ''", "unique_key"),
        (f"unique_key => '{'k' * 201}'", "unique_key"),
        ("unique_key => 'k', idempotency_key => 'i'", "unique_key"),
        ("unique_key => 'k', unique_states => '{pending,nope}'", "unique_states"),
        ("unique_key => 'k', unique_states => '{pending}'", "unique_states"),
        ("unique_key => 'k', unique_states => '{pending,running,cancelled}'", "unique_states"),
        ("unique_key => 'k', unique_period => '0 s'", "unique_period"),
        ("unique_key => 'k', unique_period => '-1 s'", "unique_period"),
        ("replace => true", "replace"),
        ("unique_period => '1 s'", "unique_period"),
    ],
)
async def test_the_sql_function_refuses_bad_unique_arguments(conn, args, field):
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetchrow(f"SELECT * FROM pgworker.enqueue('t', {args})")
    assert caught.value.sqlstate == "22023"
    assert str(caught.value).startswith(f"{field}: ")
    assert await count(conn) == 0


async def test_a_replay_never_collides_with_the_live_holder_of_the_key(conn):
    failed = await pgworker.enqueue(conn, "t", {}, unique_key="rp")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        failed.job.id,
    )
    live = await pgworker.enqueue(conn, "t", {}, unique_key="rp")
    assert live.created
    dry = await pgworker.replay(conn, [failed.job.id], by="test", dry_run=True)
    assert (dry.replayed, dry.held) == ((), {failed.job.id: live.job.id})
    result = await pgworker.replay(conn, [failed.job.id], by="test")
    assert result.replayed == ()
    assert result.skipped == {failed.job.id: "failed"}
    assert result.held == {failed.job.id: live.job.id}
    assert (
        await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", failed.job.id)
        == "failed"
    )
    # Once the holder ended, the replay goes through.
    await conn.execute("UPDATE pgworker.jobs SET status = 'completed' WHERE id = $1", live.job.id)
    assert (await pgworker.replay(conn, [failed.job.id], by="test")).replayed == (failed.job.id,)


NEW_FUNCTION = (
    "pgworker.enqueue(text, jsonb, text, anycompatible, bigint, text, text, timestamptz, "
    "interval, bigint, text, text, text[], interval, boolean)"
)


async def test_migration_17_keeps_the_functions_grants(empty_dsn):
    from .test_concurrency_key import FUNCTION, apply_only
    from .test_sql_enqueue import migrated_to

    conn = await asyncpg.connect(empty_dsn)
    roles = ("pgw_unique_granted", "pgw_unique_other")
    try:
        for role in roles:
            await conn.execute(f"DROP ROLE IF EXISTS {role}")
            await conn.execute(f"CREATE ROLE {role}")
        await migrated_to(conn, 16)
        await conn.execute(f"REVOKE EXECUTE ON FUNCTION {FUNCTION} FROM PUBLIC")
        await conn.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {roles[0]}")
        await apply_only(conn, 17)
        allowed = "SELECT has_function_privilege($1, $2, $3)"
        assert await conn.fetchval(allowed, roles[0], NEW_FUNCTION, "EXECUTE")
        assert not await conn.fetchval(allowed, roles[1], NEW_FUNCTION, "EXECUTE")
    finally:
        for role in roles:
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()


async def test_the_cli_enqueues_with_a_unique_key_and_shows_it(conn, dsn):
    first = cli("enqueue", "t", "--unique-key", "cli-k", "--dsn", dsn)
    assert first.returncode == 0, first.stderr
    job = json.loads(first.stdout)
    again = cli(
        "enqueue",
        "t",
        "--payload",
        '{"v": 2}',
        "--unique-key",
        "cli-k",
        "--replace",
        "--unique-states",
        "pending,running",
        "--dsn",
        dsn,
    )
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["id"], json.loads(again.stdout)["created"]) == (
        job["id"],
        False,
    )
    assert (await pgworker.get_job(conn, job["id"])).payload == {"v": 2}
    shown = cli("show", str(job["id"]), "--dsn", dsn)
    [line] = [line for line in shown.stdout.splitlines() if "unique_key" in line]
    assert line.split() == ["unique_key", "cli-k"]
    period = cli(
        "enqueue",
        "t",
        "--unique-key",
        "p",
        "--unique-states",
        "pending,running,completed",
        "--unique-period",
        "60",
        "--dsn",
        dsn,
    )
    assert period.returncode == 0, period.stderr
    await conn.execute("DELETE FROM pgworker.jobs WHERE unique_key = 'p'")
    refused = cli("enqueue", "t", "--unique-key", "x", "--unique-states", "pending", "--dsn", dsn)
    assert refused.returncode == 2 and "unique_states" in refused.stderr
    refused = cli("enqueue", "t", "--replace", "--dsn", dsn)
    assert refused.returncode == 2 and "replace" in refused.stderr
    await conn.execute("UPDATE pgworker.jobs SET status = 'running'")
    running = cli("enqueue", "t", "--unique-key", "cli-k", "--replace", "--dsn", dsn)
    assert running.returncode != 0 and "running" in running.stderr
    assert await count(conn) == 1


async def test_http_takes_the_unique_arguments(conn, dsn):
    async with serving(dsn) as served, served.client() as api:
        body = {"type": "t", "payload": {"v": 1}, "unique_key": "h-k"}
        created = await api.post("/jobs", json=body)
        assert created.status_code == 201, created.text
        assert created.json()["unique_key"] == "h-k"
        again = await api.post("/jobs", json={**body, "payload": {"v": 2}})
        assert (again.status_code, again.json()["id"]) == (200, created.json()["id"])
        replaced = await api.post("/jobs", json={**body, "payload": {"v": 3}, "replace": True})
        assert (replaced.status_code, replaced.json()["payload"]) == (200, {"v": 3})
        for bad, field in [
            ({"unique_key": ""}, "unique_key"),
            ({"unique_key": "k" * 201}, "unique_key"),
            ({"unique_key": "k", "unique_states": ["pending", "nope"]}, "unique_states"),
            ({"unique_key": "k", "unique_states": ["pending"]}, "unique_states"),
            (
                {"unique_key": "k", "unique_states": ["pending", "running", "failed"]},
                "unique_states",
            ),
            ({"unique_key": "k", "unique_period": 0}, "unique_period"),
            ({"unique_key": "k", "unique_period": "1"}, "unique_period"),
            ({"replace": True}, "replace"),
            ({"unique_key": "k", "idempotency_key": "i"}, "unique_key"),
        ]:
            refused = await api.post("/jobs", json={"type": "t", "payload": {}, **bad})
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == field, refused.text
        await conn.execute("UPDATE pgworker.jobs SET status = 'running'")
        running = await api.post("/jobs", json={**body, "replace": True})
        assert running.status_code == 409 and "running" in running.json()["error"], running.text
        async with http(served) as page:
            html = (await page.get(f"/ui/jobs/{created.json()['id']}")).text
            assert "Unique key" in html and "h-k" in html
    assert await count(conn) == 1


async def test_psycopg_and_pgworker_sync_take_the_unique_key(conn, dsn):
    import psycopg

    import pgworker.sync

    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        a = await pgworker.enqueue(aconn, "t", {"n": 1}, unique_key="ps")
        b = await pgworker.enqueue(aconn, "t", {"n": 2}, unique_key="ps", replace=True)
        [c] = await pgworker.enqueue_many(aconn, [JobSpec("t", {"n": 3}, unique_key="ps")])
    with psycopg.connect(dsn) as sconn:
        d = pgworker.sync.enqueue(sconn, "t", {"n": 4}, unique_key="ps")
        [e] = pgworker.sync.enqueue_many(sconn, [JobSpec("t", {}, unique_key="other")])
    assert a.created and e.created
    assert [r.created for r in (b, c, d)] == [False, False, False]
    assert {r.job.id for r in (a, b, c, d)} == {a.job.id}
    assert (await pgworker.get_job(conn, a.job.id)).payload == {"n": 2}
    assert await count(conn) == 2


# --- unique keys a hostile user gives --------------------------------------------------------


async def test_enqueue_many_with_one_unique_key_twice_in_a_batch(conn) -> None:
    """Two specs of one batch with the same unique key: one job, both results name it (or a
    clear error naming the field), never a raw unique-violation."""
    specs = [pgworker.JobSpec("u", {"n": n}, unique_key="k") for n in range(2)]
    results = await pgworker.enqueue_many(conn, specs)
    assert results[0].job.id == results[1].job.id
    assert [r.created for r in results] == [True, False]


async def test_unique_states_from_a_generator_are_named_in_the_error(conn) -> None:
    """A generator of states is read once: the refusal must still show what was given."""
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.enqueue(
            conn, "u", {}, unique_key="k", unique_states=(s for s in ["pending"])
        )
    assert "'pending'" in str(caught.value)
