"""Versioned payloads for rolling deploys: a task's payload version, the
upgraders that let a newer handler run older jobs, the claim that takes only the (type, version)
pairs a worker serves, and `pgworker status` naming the pending pairs nobody serves."""

from __future__ import annotations

import json

import asyncpg
import pytest

import pgworker
from pgworker import operations
from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries
from pgworker.cli import _render
from pgworker.registry import served_key

from .helpers import attempts, has_status, serving_guarded, wait_for

Q = queries("pgworker")
pytestmark = pytest.mark.asyncio(loop_scope="session")


async def jobs_in(conn) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


# --- declaring versions -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "2", True, 2.0, None, 2**31])
async def test_a_task_version_is_an_int_from_1(bad):
    registry = pgworker.Registry()
    with pytest.raises(pgworker.ConfigError) as caught:
        registry.task("x", version=bad)
    assert caught.value.field == "version"
    assert "x" not in registry


def _up(payload):
    return payload


async def _async_up(payload):
    return payload


@pytest.mark.parametrize(
    ("upgrade", "says"),
    [
        ([_up], "dict"),
        ({2: _up}, "from 1 to 1"),
        ({0: _up}, "from 1 to 1"),
        ({True: _up}, "from 1 to 1"),
        ({"1": _up}, "from 1 to 1"),
        ({1: "not a function"}, "upgrade[1] must be a function"),
        ({1: _async_up}, "plain function"),
    ],
)
async def test_upgraders_are_plain_functions_keyed_by_older_versions(upgrade, says):
    registry = pgworker.Registry()
    with pytest.raises(pgworker.ConfigError) as caught:
        registry.task("x", version=2, upgrade=upgrade)
    assert caught.value.field == "upgrade" and says in str(caught.value)
    assert "x" not in registry


async def test_upgraders_lead_step_by_step_to_the_task_version():
    registry = pgworker.Registry()
    with pytest.raises(pgworker.ConfigError) as caught:
        registry.task("gap", version=3, upgrade={1: _up})  # nothing turns version 2 into 3
    assert caught.value.field == "upgrade" and "no upgrader for version 2" in str(caught.value)

    registry.task("plain")(_up)
    registry.task("two", version=2)(_up)
    registry.task("three", version=3, upgrade={2: _up})(_up)
    registry.task("chain", version=3, upgrade={1: _up, 2: _up})(_up)
    assert registry["plain"].version == 1 and not registry["plain"].upgrade
    assert registry.served() == [
        ("plain", 1),
        ("two", 2),
        ("three", 2),
        ("three", 3),
        ("chain", 1),
        ("chain", 2),
        ("chain", 3),
    ]


async def test_served_key_is_unambiguous():
    """`workers.types` holds version 1 as the bare name, as before versions existed; a name with
    an `@` always carries its version, so the text after the last `@` is the version."""
    assert served_key("mail", 1) == "mail"
    assert served_key("mail", 2) == "mail@2"
    assert served_key("a@2", 1) == "a@2@1"
    assert len({served_key("a@2", 1), served_key("a", 2), served_key("a@2", 2)}) == 3


# --- enqueue writes the version -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "2", True, 1.5, 2**31])
async def test_enqueue_rejects_a_bad_version_and_writes_nothing(conn, bad):
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.enqueue(conn, "x", {}, version=bad)
    assert caught.value.field == "version"
    # Both paths of enqueue_many: COPY (plain specs) and INSERT (an idempotency key).
    for key in (None, "k"):
        specs = [
            pgworker.JobSpec("x", {}, idempotency_key=key),
            pgworker.JobSpec("x", {}, idempotency_key=key and key + "2", version=bad),
        ]
        with pytest.raises(pgworker.ValidationError) as caught:
            await pgworker.enqueue_many(conn, specs)
        assert caught.value.field == "specs[1].version"
    assert await jobs_in(conn) == 0


async def test_every_enqueue_path_writes_the_version(conn):
    one = await pgworker.enqueue(conn, "x", {"n": 1})
    two = await pgworker.enqueue(conn, "x", {"n": 2}, version=2)
    # COPY: the first spec's shape (no options) is cached for its type; a spec of the same type
    # with a version must not take it.
    copied = await pgworker.enqueue_many(
        conn,
        [
            pgworker.JobSpec("x", {"n": 3}),
            pgworker.JobSpec("x", {"n": 4}, version=3),
            pgworker.JobSpec("x", {"n": 5}),
            pgworker.JobSpec("x", {"n": 6}, version=1),
        ],
    )
    inserted = await pgworker.enqueue_many(
        conn,
        [
            pgworker.JobSpec("x", {"n": 7}, idempotency_key="a"),
            pgworker.JobSpec("x", {"n": 8}, idempotency_key="b", version=4),
        ],
    )
    results = [one, two, *copied, *inserted]
    expected = [1, 2, 1, 3, 1, 1, 1, 4]
    assert [r.job.version for r in results] == expected
    for r in results:
        stored = await pgworker.get_job(conn, r.job.id)
        assert stored == r.job
    rows = await conn.fetch("SELECT payload::json->>'n' AS n, version FROM pgworker.jobs")
    assert sorted((int(r["n"]), r["version"]) for r in rows) == list(
        zip(range(1, 9), expected, strict=True)
    )


async def test_registry_enqueue_writes_the_task_version(conn):
    registry = pgworker.Registry()
    registry.task("x", version=3, upgrade={2: _up})(_up)
    registry.task("old")(_up)
    assert (await registry.enqueue(conn, "x", {})).job.version == 3
    assert (await registry.enqueue(conn, "x", {}, version=2)).job.version == 2
    assert (await registry.enqueue(conn, "old", {})).job.version == 1
    assert (await pgworker.enqueue(conn, "unknown", {})).job.version == 1
    assert await conn.fetchval("SELECT array_agg(version ORDER BY id) FROM pgworker.jobs") == [
        3,
        2,
        1,
        1,
    ]


# --- claims ---------------------------------------------------------------------------------


def recording(seen: list, version: int = 1, stored: list | None = None, **options):
    """A registry whose `x` handler (at `version`) records what it sees: (the job's version, its
    payload argument, ctx.payload) in `seen`, and ctx.job.payload in `stored`."""
    registry = pgworker.Registry()

    @registry.task("x", version=version, **options)
    async def x(ctx, payload):
        seen.append((ctx.job.version, payload, ctx.payload))
        if stored is not None:
            stored.append(ctx.job.payload)
        return version

    return registry


async def test_a_version_1_worker_leaves_version_2_jobs_for_a_version_2_worker(dsn, conn):
    v1 = await pgworker.enqueue(conn, "x", {"n": 1})
    v2 = await pgworker.enqueue(conn, "x", {"number": 2}, version=2)
    seen: list = []
    # Both jobs are due before the worker starts: its first claim (up to 4 jobs) saw both.
    async with serving_guarded(recording(seen), dsn):
        await wait_for(lambda: has_status(conn, v1.job.id, "completed"))
        row = await conn.fetchrow(
            "SELECT status, attempts FROM pgworker.jobs WHERE id = $1", v2.job.id
        )
        assert tuple(row) == ("pending", 0)
    assert seen == [(1, {"n": 1}, {"n": 1})]

    # A version-2 worker without an upgrader runs the version-2 job, and leaves a version-1 one.
    later_v1 = await pgworker.enqueue(conn, "x", {"n": 3})
    async with serving_guarded(recording(seen, version=2), dsn):
        await wait_for(lambda: has_status(conn, v2.job.id, "completed"))
        assert await has_status(conn, later_v1.job.id, "pending")
    assert seen[1:] == [(2, {"number": 2}, {"number": 2})]
    assert (await pgworker.get_job(conn, v2.job.id)).result == 2


async def test_an_upgrader_lets_a_newer_worker_run_older_jobs(dsn, conn):
    def v1_to_v2(p):
        return {"number": p.pop("n")}  # changes its input: ctx.job keeps the stored payload

    def v2_to_v3(p):
        return {**p, "unit": "kg"}

    old = await pgworker.enqueue(conn, "x", {"n": 1})
    middle = await pgworker.enqueue(conn, "x", {"number": 2}, version=2)
    current = await pgworker.enqueue(conn, "x", {"number": 3, "unit": "g"}, version=3)
    seen: list = []
    stored: list = []
    registry = recording(seen, 3, stored, upgrade={1: v1_to_v2, 2: v2_to_v3})
    async with serving_guarded(registry, dsn):
        for r in (old, middle, current):
            await wait_for(lambda r=r: has_status(conn, r.job.id, "completed"))
    # The handler and ctx.payload see the upgraded payload; the job keeps what was enqueued.
    assert sorted(seen, key=lambda s: s[1]["number"]) == [
        (1, {"number": 1, "unit": "kg"}, {"number": 1, "unit": "kg"}),
        (2, {"number": 2, "unit": "kg"}, {"number": 2, "unit": "kg"}),
        (3, {"number": 3, "unit": "g"}, {"number": 3, "unit": "g"}),
    ]
    assert sorted(stored, key=lambda p: p.get("number", 0)) == [
        {"n": 1},
        {"number": 2},
        {"number": 3, "unit": "g"},
    ]
    stored = await pgworker.get_job(conn, old.job.id)
    assert (stored.version, stored.payload) == (1, {"n": 1})


async def test_an_upgrader_that_raises_fails_the_attempt_as_a_handler_would(dsn, conn):
    def broken(p):
        raise KeyError("missing field")

    def refuses(p):
        raise pgworker.PermanentError("cannot upgrade this one")

    calls: list = []
    registry = pgworker.Registry()

    @registry.task("x", version=2, upgrade={1: broken}, retry=pgworker.RetryPolicy(1, 0.01))
    async def x(ctx, payload):
        calls.append(payload)

    @registry.task("y", version=2, upgrade={1: refuses})
    async def y(ctx, payload):
        calls.append(payload)

    retried = await pgworker.enqueue(conn, "x", {})
    final = await pgworker.enqueue(conn, "y", {})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, retried.job.id, "failed"))
        await wait_for(lambda: has_status(conn, final.job.id, "failed"))
    assert calls == []
    assert [(a["outcome"], a["error_type"]) for a in await attempts(conn, retried.job.id)] == [
        ("retried", "KeyError"),
        ("failed", "KeyError"),
    ]
    assert [(a["outcome"], a["error_type"]) for a in await attempts(conn, final.job.id)] == [
        ("failed", "PermanentError"),
    ]


# --- the claim's plan -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "force_generic_plan"])
@pytest.mark.parametrize("other_versions", [[], [("x", 2), ("y", 2), ("y", 3)]])
async def test_the_claim_reads_each_served_type_along_its_index(dsn, conn, mode, other_versions):
    """The W4 check of the benchmark (bench/systems/pgworker.py), on a table holding many
    finished jobs: every read of jobs that finds the claim's candidates is a scan of
    jobs_claim_type_idx, whatever versions the worker serves, in the plan the worker uses
    (generic) and in a custom one; the claim takes only the pairs served."""
    await conn.execute(
        """INSERT INTO pgworker.jobs (type, status, version, finished_at)
           SELECT 'x', 'completed', 1 + i % 2, now() FROM generate_series(1, 20000) AS i"""
    )
    await pgworker.enqueue_many(
        conn,
        [pgworker.JobSpec("x", {}, version=1 + i % 3) for i in range(300)]
        + [pgworker.JobSpec("y", {}, queue="q2", version=1 + i % 3) for i in range(300)],
    )
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    served = [("x", 1), ("y", 1), *other_versions]
    types = "{" + ",".join(t for t, _ in served) + "}"
    versions = "{" + ",".join(str(v) for _, v in served) + "}"
    pool = await create_pool(dsn, size=1)
    try:
        async with pool.acquire() as c:
            await c.execute(
                "PREPARE claim(text[], text[], int, text, float8, int[], text, text, text[], "
                "int[], boolean, int[]) AS " + files.queries("pgworker")["job_claim"]
            )
            claim = c.transaction()
            await claim.start()
            try:
                await c.execute(f"SET LOCAL plan_cache_mode = {mode}")
                plan = [
                    r[0]
                    for r in await c.fetch(
                        "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE claim('{default,q2}', '{x,y}', 10, "
                        f"'w', 30, '{{3,3}}', NULL, 'off', '{types}', '{versions}', false, NULL)"
                    )
                ]
                claimed = await c.fetch(
                    "SELECT type, version FROM pgworker.jobs WHERE status = 'running'"
                )
            finally:
                await claim.rollback()  # the claim really ran
    finally:
        await pool.close()
    text = "\n".join(plan)
    scans = [line.strip() for line in plan if "Scan" in line and " on jobs" in line]
    candidate_scans = [s for s in scans if "jobs_pkey" not in s]
    assert candidate_scans, text
    assert all("Scan using jobs_claim_type_idx on jobs" in s for s in candidate_scans), text
    assert "Seq Scan" not in text and "Bitmap" not in text, text
    # One scan per (queue, type, version) served: 2 queues, each with every pair.
    assert any(f"loops={2 * len(served)})" in s for s in candidate_scans), text
    assert claimed and {(r["type"], r["version"]) for r in claimed} <= set(served)


# --- status -----------------------------------------------------------------------------------


async def test_status_lists_the_pending_type_versions_nobody_serves(dsn, conn):
    await pgworker.enqueue(conn, "x", {}, version=2)
    await pgworker.enqueue(conn, "x", {}, version=3)
    await pgworker.enqueue(conn, "x", {}, delay=3600)  # version 1: served, not due
    await pgworker.enqueue(conn, "plain", {}, version=2, queue="q2")
    # A type whose name looks like a served key: version 1 of "x@2" is not version 2 of "x".
    await pgworker.enqueue(conn, "x@2", {}, delay=3600)
    seen: list = []
    registry = recording(seen, version=2, upgrade={1: _up})
    async with serving_guarded(registry, dsn, queues=["default", "q2"]) as worker:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pgworker.jobs WHERE version = 2 AND status = 'completed'"
            )
        )
        found = await operations.status(conn)
        assert [tuple(w["types"]) for w in found["workers"]] == [("x", "x@2")]
        assert w_is(found, worker)
    assert [(u["queue"], u["type"], u["version"]) for u in found["unserved"]] == [
        ("default", "x", 3),
        ("default", "x@2", 1),
        ("q2", "plain", 2),
    ]
    text = _render.status_text(found)
    assert text.split("pending types that no live worker serves:\n")[1].splitlines() == [
        "  default: x (version 3)",
        "  default: x@2",
        "  q2: plain (version 2)",
    ]
    assert json.loads(_render.status_json(found))["unserved"] == [
        {"queue": "default", "type": "x", "version": 3},
        {"queue": "default", "type": "x@2"},
        {"queue": "q2", "type": "plain", "version": 2},
    ]


def w_is(found, worker) -> bool:
    return [w["worker_id"] for w in found["workers"]] == [worker.settings.worker_id]


async def test_a_worker_serving_a_name_with_an_at_sign_serves_its_version_1(dsn, conn):
    await pgworker.enqueue(conn, "x@2", {}, delay=3600)
    await pgworker.enqueue(conn, "x", {}, version=2, delay=3600)
    registry = pgworker.Registry()
    registry.task("x@2")(_up)
    async with serving_guarded(registry, dsn):
        found = await operations.status(conn)
    assert [tuple(w["types"]) for w in found["workers"]] == [("x@2@1",)]
    assert [(u["type"], u["version"]) for u in found["unserved"]] == [("x", 2)]


# --- migrate through a pool ------------------------------------------------------------------


async def test_migrate_through_a_pool(empty_dsn):
    """migrate(pool) took the migration lock on one pooled connection, then raised
    AttributeError (a pool has no transaction), the lock left behind."""
    async with asyncpg.create_pool(empty_dsn, min_size=1, max_size=3) as p:
        assert await pgworker.migrate(p) == [m.version for m in files.migrations("pgworker")]
        assert await pgworker.migrate(p) == []
        locks = await p.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        assert locks == 0
