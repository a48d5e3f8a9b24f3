"""Plans made while `jobs` was empty, beyond the claim (test_claim_cost.py): the statements a
worker repeats on its shared connection (outcomes, heartbeat, rescue) keep the generic plan they
got on their first run; once 100,000 jobs arrive, that plan still probes the tables by key, as a
plan made on the full table does. A transactional step's record, in a session that is not the
worker's, is planned with its values. (bench/plan_cache.py measures every repeated statement.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries

pytestmark = pytest.mark.asyncio(loop_scope="session")

SQL = files.queries("pgworker")
BACKLOG = 100_000
RUNNING = 1000
EXPIRED = 5000
BATCH = 10


def literal(values: list[Any]) -> str:
    return "'{" + ",".join(f'"{v}"' for v in values) + "}'"


def attempts(keys: list[Any]) -> str:
    """The attempts' three arrays (ids, numbers, claim times), as EXECUTE arguments."""
    return ", ".join(literal([k[f] for k in keys]) for f in ("id", "attempts", "claimed_at_text"))


def finish_many(running: list[Any], expired: list[Any]) -> str:
    n = len(running)
    done = literal(["completed"] * n)
    none = literal(["NULL"] * n).replace('"NULL"', "NULL")
    ids, numbers, times = attempts(running).split(", ")
    zeros = literal([0] * n)
    return ", ".join([ids, numbers, done, done, none, none, none, zeros, zeros, times, none, zeros])


def rescue(running: list[Any], expired: list[Any]) -> str:
    n = len(expired)
    return (
        f"{attempts(expired)}, {literal(['pending'] * n)}, {literal([1.0] * n)}, "
        f"{literal([1] * n)}, 'leader'"
    )


STATEMENTS = {
    "job_finish_many": finish_many,
    "attempt_outcomes": lambda running, expired: attempts(running),
    "worker_heartbeat": lambda running, expired: f"{attempts(running)}, 30",
    "jobs_rescue": rescue,
    # A waiter's (_waits.py): the jobs awaited marked, then read.
    "jobs_await_mark": lambda running, expired: literal([k["id"] for k in running]),
    "jobs_awaited": lambda running, expired: literal([k["id"] for k in running]),
}


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += nodes(child)
    return found


async def explain(c: Any, name: str, args: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of statement `name` prepared in this session, rolled back: its
    buffers, and the rows its scans of jobs and job_attempts read."""
    tr = c.transaction()
    await tr.start()
    try:
        raw = await c.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}({args})")
    finally:
        await tr.rollback()
    plan = json.loads(raw)[0]["Plan"]
    scans = [
        n
        for n in nodes(plan)
        if n.get("Relation Name") in {"jobs", "job_attempts"} and n["Node Type"].endswith("Scan")
    ]
    return {
        "buffers": plan["Shared Hit Blocks"] + plan["Shared Read Blocks"],
        # The rows each scan of those tables read, over all its loops.
        "read": {
            f"{n['Node Type']} on {n['Relation Name']} ({n.get('Index Name')})": n["Actual Loops"]
            * (n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
            for n in scans
        },
        "plan": plan,
    }


async def fill(conn: asyncpg.Connection) -> None:
    """100,000 pending jobs, 1,000 running ones and 5,000 whose lease expired, with their
    attempts; a leader for the rescue's fence."""
    await conn.execute(
        "INSERT INTO pgworker.jobs (type) SELECT 't' FROM generate_series(1, $1)", BACKLOG
    )
    for n, lease in ((RUNNING, "30 seconds"), (EXPIRED, "-1 minute")):
        await conn.execute(
            f"""WITH j AS (
                INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, worker_id,
                                           lease_expires_at)
                SELECT 't', 'running', 1, now(), 'w', now() + interval '{lease}'
                FROM generate_series(1, $1)
                RETURNING id, claimed_at, correlation_id)
            INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                               correlation_id, started_at)
            SELECT id, 1, 't', 'default', 'w', correlation_id, claimed_at FROM j""",
            n,
        )
    await conn.execute(
        "INSERT INTO pgworker.leader (name, worker_id, elected_at, expires_at) "
        "VALUES ('maintenance', 'leader', now(), now() + interval '1 hour')"
    )


async def keys(conn: asyncpg.Connection, expired: bool) -> list[Any]:
    return [
        dict(r)
        for r in await conn.fetch(
            "SELECT id, attempts, to_char(claimed_at AT TIME ZONE 'UTC', "
            '\'YYYY-MM-DD"T"HH24:MI:SS.US"Z"\') AS claimed_at_text FROM pgworker.jobs '
            "WHERE status = 'running' AND (lease_expires_at < now()) = $1 ORDER BY id LIMIT $2",
            expired,
            BATCH,
        )
    ]


async def test_outcome_heartbeat_and_rescue_plans_made_on_an_empty_table_probe_by_key(dsn, conn):
    """Each statement's generic plan is made in a worker's session on the empty, analysed
    tables; once 100,000 jobs have arrived, that cached plan reads by key (no scan of a whole
    table or index) and about as many buffers as one made on the full table. Before, the cached
    plans read the whole primary key: 3,400 to 6,800 buffers for a batch of 10 (80 to 370 ms)
    against 70 to 150."""
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
    made_up = [{"id": -1, "attempts": 1, "claimed_at_text": datetime.now(UTC).isoformat()}]
    pool = await create_pool(dsn, size=1, keyed=True)
    try:
        async with pool.acquire() as c:
            for name, args in STATEMENTS.items():
                await c.execute(f"PREPARE {name} AS {SQL[name]}")
                await explain(c, name, args(made_up, made_up))  # plans it, and caches the plan
            await fill(conn)
            running, expired = await keys(conn, False), await keys(conn, True)
            cached = {n: await explain(c, n, a(running, expired)) for n, a in STATEMENTS.items()}
            await conn.execute("VACUUM ANALYZE pgworker.jobs")
            await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
            fresh = {}
            for name, args in STATEMENTS.items():
                await c.execute(f"DEALLOCATE {name}")
                await c.execute(f"PREPARE {name} AS {SQL[name]}")
                fresh[name] = await explain(c, name, args(running, expired))
    finally:
        await pool.close()
    for name in STATEMENTS:
        # A probe per attempt of the batch (10), not a scan of the table or of its expired jobs.
        assert all(read <= 2 * BATCH for read in cached[name]["read"].values()), (
            name,
            cached[name]["read"],
        )
        assert cached[name]["buffers"] <= 2 * fresh[name]["buffers"] + 20, (
            name,
            cached[name]["buffers"],
            fresh[name]["buffers"],
        )


async def test_a_transactional_steps_record_is_planned_with_its_values(dsn, conn):
    """In a session set up as the steps' pool sets its own (not the worker's), the record of a
    transactional step, run often enough on an empty table for PostgreSQL to keep a generic plan
    (a scan of `jobs`), reads `jobs` by key once 100,000 jobs have arrived."""
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    q = queries("pgworker")
    step = await asyncpg.connect(dsn)
    key = (-1, 1, datetime.now(UTC))

    async def record() -> int:
        """The sequential scans of `jobs` one record made."""
        async with step.transaction():
            txid = await q.step_transaction(step)
            seen = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
            before = await step.fetchval(seen)
            assert await q.job_step_record(step, key, "s", "1", None, txid) == (True, None)
            return int(await step.fetchval(seen)) - int(before)

    try:
        for _ in range(6):
            await record()
        await conn.execute(
            "INSERT INTO pgworker.jobs (type) SELECT 't' FROM generate_series(1, $1)", BACKLOG
        )
        assert await record() == 0
    finally:
        await step.close()
