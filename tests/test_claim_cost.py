"""What a claim reads: not the pending jobs of the types a worker does not serve, not a whole
table because its plan was made while the table was empty; and, reading each served type on its
own, still the jobs of all of them in one claim order."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker import JobSpec
from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import claim_statement, queries

pytestmark = pytest.mark.asyncio(loop_scope="session")

BACKLOG = 100_000
PREPARE = (
    "PREPARE claim(text[], text[], int, text, float8, int[], text, text, text[], int[], boolean, "
    "int[]) AS "
)


def claim_sql(served: int) -> str:
    """The claim a worker serving `served` types of queue `default` runs, 10 jobs at a time."""
    return files.queries("pgworker")[claim_statement(served, 10)]


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += nodes(child)
    return found


async def explain_claim(c: Any, types: list[str]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim prepared as `claim` in this session, rolled back:
    what it read of jobs (buffers, rows dropped by a filter, sequential scans)."""
    array = "{" + ",".join(types) + "}"
    tr = c.transaction()
    await tr.start()
    try:
        raw = await c.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim('{default}', "
            f"'{array}', 10, 'w', 30, '{{{','.join('3' for _ in types)}}}', NULL, 'off', "
            f"'{array}', '{{{','.join('1' for _ in types)}}}', false, NULL)"
        )
    finally:
        await tr.rollback()
    plan = json.loads(raw)[0]["Plan"]
    jobs = [n for n in nodes(plan) if n.get("Relation Name") == "jobs"]
    return {
        "buffers": plan["Shared Hit Blocks"] + plan["Shared Read Blocks"],
        "removed": sum(n.get("Rows Removed by Filter", 0) for n in jobs),
        "seq_scans": [n for n in jobs if n["Node Type"] == "Seq Scan"],
        "claimed": plan["Actual Rows"],
        "plan": plan,
    }


async def add_pending(conn: asyncpg.Connection, types: list[str], each: int, age: str) -> None:
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, run_at) SELECT t, now() - $2::text::interval "
        "FROM unnest($1::text[]) AS t, generate_series(1, $3)",
        types,
        age,
        each,
    )


@pytest.mark.parametrize("served", [1, 10, 100])
async def test_pending_jobs_of_unserved_types_cost_the_claim_nothing(dsn, conn, served):
    """100,000 pending jobs of a type nobody serves, first in claim order in the same queue: the
    claim reads no more than without them (the old one dropped all 100,000 by filter, reading
    3,800 buffers)."""
    types = [f"t{i}" for i in range(served)]
    await add_pending(conn, types, 20, "1 minute")
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    pool = await create_pool(dsn, size=1, keyed=True)
    try:
        async with pool.acquire() as c:
            await c.execute(PREPARE + claim_sql(len(types)))
            alone = await explain_claim(c, types)
            await add_pending(conn, ["unserved"], BACKLOG, "1 hour")
            await conn.execute("VACUUM ANALYZE pgworker.jobs")
            behind = await explain_claim(c, types)
    finally:
        await pool.close()
    assert alone["claimed"] == behind["claimed"] == 10
    assert behind["removed"] < 100, behind["plan"]
    assert not behind["seq_scans"], behind["plan"]
    # A deeper index costs a few more buffers per probe, not a share of the backlog.
    assert behind["buffers"] <= 2 * alone["buffers"], (alone["buffers"], behind["buffers"])
    assert behind["buffers"] < 1500, behind["plan"]


async def test_a_claim_planned_on_an_empty_table_reads_by_index_once_it_fills(dsn, conn):
    """The worker's pool makes the claim's generic plan on an empty (analysed) table; once
    100,000 jobs arrive, that same cached plan reads as little as one made on the full table."""
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    pool = await create_pool(dsn, size=1, keyed=True)
    try:
        async with pool.acquire() as c:
            await c.execute("SET plan_cache_mode = force_generic_plan")
            await c.execute(PREPARE + claim_sql(1))
            empty = await explain_claim(c, ["t"])  # plans it, and caches the plan
            assert empty["claimed"] == 0
            await add_pending(conn, ["t"], BACKLOG, "1 minute")
            await add_pending(conn, ["unserved"], BACKLOG, "1 hour")
            cached = await explain_claim(c, ["t"])
            await conn.execute("VACUUM ANALYZE pgworker.jobs")
            await c.execute("DEALLOCATE claim")
            await c.execute(PREPARE + claim_sql(1))
            fresh = await explain_claim(c, ["t"])
    finally:
        await pool.close()
    assert cached["claimed"] == 10
    assert not cached["seq_scans"], cached["plan"]
    assert cached["removed"] < 100, cached["plan"]
    assert cached["buffers"] <= 2 * fresh["buffers"], (cached["buffers"], fresh["buffers"])


async def test_the_worker_plans_by_index_only(dsn, monkeypatch):
    """The worker's pool is the one the test above measures (`keyed`)."""
    import pgworker.worker as worker_module

    made: list[dict[str, Any]] = []
    real = worker_module.create_pool

    async def recording(*args: Any, **kwargs: Any) -> asyncpg.Pool:
        made.append(kwargs)
        return await real(*args, **kwargs)

    monkeypatch.setattr(worker_module, "create_pool", recording)
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx, payload):
        pass

    async with pgworker.Worker(registry, dsn):
        pass
    assert made and all(kw.get("keyed") for kw in made), made


async def claim(
    conn: Any, limit: int, served: list[tuple[str, int]], queues=("default",), wide=None
):
    return await queries("pgworker").job_claim(
        conn,
        queues=list(queues),
        types=sorted({t for t, _ in served}),
        default_max_retries=[3] * len({t for t, _ in served}),
        limit=limit,
        worker_id="w",
        lease=30.0,
        code_version=None,
        version_1_types=[t for t, v in served if v == 1],
        other_versions=[f"{t}@{v}" for t, v in served if v != 1],
        wide=wide,
    )


@pytest.mark.parametrize("wide", [None, True, False])
async def test_one_claim_order_across_types_versions_and_queues(dsn, conn, wide):
    """Highest priority first, then oldest run_at, then id, whichever served (queue, type,
    version) a job belongs to; a job not served is never taken, however early. The same with
    either statement (None: the one the worker chooses, job_claim_wide.sql for the limits below
    the 6 pairs served)."""
    specs = [
        JobSpec("a", {"n": 1}, priority=0),
        JobSpec("b", {"n": 2}, priority=5),
        JobSpec("x", {"n": 3}, priority=50),  # not served
        JobSpec("a", {"n": 4}, priority=5),
        JobSpec("b", {"n": 5}, priority=0, version=2),
        JobSpec("b", {"n": 6}, priority=9, version=3),  # version 3 not served
        JobSpec("a", {"n": 7}, priority=5, queue="q2"),
        JobSpec("b", {"n": 8}, priority=1, queue="q3"),  # queue not served
        JobSpec("a", {"n": 9}, priority=0),
        JobSpec("b", {"n": 10}, priority=7),
    ]
    enqueued = await pgworker.enqueue_many(conn, specs)
    n_of = {r.job.id: s.payload["n"] for r, s in zip(enqueued, specs, strict=True)}
    served = [("a", 1), ("b", 1), ("b", 2)]
    taken = []
    for limit in (3, 1, 2, 10):
        rows = await claim(conn, limit, served, queues=("default", "q2"), wide=wide)
        assert len(rows) <= limit
        taken.append([n_of[r["id"]] for r in rows])
    assert taken == [[10, 2, 4], [7], [1, 5], [9]]


@pytest.mark.parametrize(("limit", "expected"), [(4, [-4, -5, -14, -15]), (1, [-4])])
async def test_a_claim_walks_past_the_jobs_another_claim_holds(dsn, conn, pool, limit, expected):
    """While one claim's transaction holds its jobs, another claim takes others, going on past the
    held ones within a type, rather than none: when it searches every type served (a limit of
    at least their number) and when it searches those whose first jobs come first."""
    await pgworker.enqueue_many(
        conn,
        [JobSpec("a", {}, priority=-n) for n in range(6)]
        + [JobSpec("b", {}, priority=-10 - n) for n in range(10)],
    )
    async with pool.acquire() as first, first.transaction():
        held = await claim(first, 4, [("a", 1), ("b", 1)])
        async with pool.acquire() as second:
            rows = await claim(second, limit, [("a", 1), ("b", 1)])
    assert [r["priority"] for r in held] == [0, -1, -2, -3]
    # The first also held b's first four for as long as its claim ran.
    assert [r["priority"] for r in rows] == expected


async def test_migration_11_keeps_an_index_built_beforehand_and_refuses_an_invalid_one(
    empty_dsn,
):
    """An index built beforehand with CREATE INDEX CONCURRENTLY (the upgrade note's way on a big
    table) is kept; one left invalid by a failed concurrent build is refused, saying what to do,
    and nothing of the migration is applied."""
    from .test_sql_enqueue import migrated_to

    conn = await asyncpg.connect(empty_dsn)
    try:
        await migrated_to(conn, 10)
        await pgworker.enqueue_many(conn, [JobSpec("t", {}), JobSpec("t", {})])
        with pytest.raises(asyncpg.exceptions.UniqueViolationError):
            await conn.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY jobs_claim_type_idx ON pgworker.jobs (type)"
            )
        with pytest.raises(asyncpg.exceptions.RaiseError, match=r"invalid.*drop it, then migrate"):
            await pgworker.migrate(conn)
        assert await conn.fetchval("SELECT max(version) FROM pgworker.migrations") == 10
        assert await conn.fetchval("SELECT to_regclass('pgworker.jobs_claim_idx')") is not None
        await conn.execute("DROP INDEX pgworker.jobs_claim_type_idx")
        await conn.execute(
            "CREATE INDEX CONCURRENTLY jobs_claim_type_idx ON pgworker.jobs "
            "(queue, type, version, priority DESC, run_at, id) WHERE status = 'pending'"
        )
        assert (await pgworker.migrate(conn))[:1] == [11]
        indexes = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name FROM pg_index "
            "WHERE indrelid = 'pgworker.jobs'::regclass AND indisvalid"
        )
        names = {r["name"] for r in indexes}
        assert "pgworker.jobs_claim_type_idx" in names and "pgworker.jobs_claim_idx" not in names
        rows = await claim(conn, 10, [("t", 1)])
        assert len(rows) == 2
    finally:
        await conn.close()
