"""What each statement a worker runs over and over costs once `jobs` fills, when its plan was
cached while the table was empty (a new or truncated `jobs`), beside a plan made on the full
table (for the statements other than the claim).

    PYTHONPATH=. python -m bench.plan_cache [--dsn DSN] [--backlog 100000] [--batch 10] [--plans]

In a database of its own (`bench_plan_cache`, dropped at the end), autovacuum off on its tables:
each statement of sql/queries that a worker repeats is prepared in a session set up as the
worker's (its pool, `create_pool(keyed=True)`) and, for comparison, in a plain asyncpg session
(a transactional step's); executed 6 times on the empty, analysed tables (enough for PostgreSQL
to settle on a generic plan in any plan_cache_mode); then `--backlog` pending jobs, 1,000 running
ones, 1,000 whose lease expired and 20,000 finished ones arrive. Each figure is one EXPLAIN
(ANALYZE, BUFFERS) of the same prepared statement (`EXPLAIN EXECUTE`), rolled back, for a batch
of `--batch` attempts: "cached" before the tables are analysed again (what a worker meets until
autovacuum analyses them: an ANALYZE invalidates the cached plans), "analysed" after, "fresh"
prepared anew. Run it with another checkout on PYTHONPATH to measure that one's statements.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import asyncpg

import pgworker
from pgworker._db import files
from pgworker._db.connection import create_pool

DATABASE = "bench_plan_cache"
SQL = files.queries("pgworker")
RUNNING = 1000
EXPIRED = 1000
FINISHED = 20_000


def ts(t: datetime) -> str:
    return f'"{t.isoformat()}"'


def arr(values: list[Any]) -> str:
    return "'{" + ",".join(str(v) for v in values) + "}'"


class Keys:
    """The rows the statements are aimed at: attempts that hold their jobs, expired ones, a
    pending job; made-up ones on the empty table."""

    def __init__(self, running: list[Any], expired: list[Any], pending: int) -> None:
        self.running = running
        self.expired = expired
        self.pending = pending

    def arrays(self, keys: list[Any]) -> str:
        return ", ".join(
            [
                arr([k["id"] for k in keys]),
                arr([k["attempts"] for k in keys]),
                arr([ts(k["claimed_at"]) for k in keys]),
            ]
        )

    def one(self) -> Any:
        return self.running[0]


def finish_many(k: Keys) -> str:
    n = len(k.running)
    return (
        f"{arr([r['id'] for r in k.running])}, {arr([r['attempts'] for r in k.running])}, "
        f"{arr(['completed'] * n)}, {arr(['completed'] * n)}, {arr(['null'] * n)}, "
        f"{arr(['null'] * n)}, {arr(['null'] * n)}, {arr([0] * n)}, {arr([0] * n)}, "
        f"{arr([ts(r['claimed_at']) for r in k.running])}, {arr(['null'] * n)}"
    )


def rescue(k: Keys) -> str:
    n = len(k.expired)
    return (
        f"{k.arrays(k.expired)}, {arr(['pending'] * n)}, {arr([1.0] * n)}, {arr([1] * n)}, 'bench'"
    )


def one_attempt(k: Keys) -> str:
    r = k.one()
    return f"{r['id']}, {r['attempts']}, '{r['claimed_at'].isoformat()}'"


STATEMENTS: dict[str, Callable[[Keys], str]] = {
    "job_finish_many": finish_many,
    "attempt_outcomes": lambda k: k.arrays(k.running),
    "worker_heartbeat": lambda k: f"{k.arrays(k.running)}, 30",
    "worker_register": lambda k: "'bench', 'h', 1, '{default}', '{t}', 10",
    "leader_take": lambda k: "'bench', 30",
    "jobs_expired": lambda k: "'{}', '0001-01-01T00:00:00+00:00', 0",
    "jobs_rescue": rescue,
    "jobs_prune": lambda k: "'{completed,failed,cancelled}', '{86400,86400,86400}', 1000, 'bench'",
    "workers_prune": lambda k: "86400",
    "workers_live": lambda k: "60",
    "job_steps_done": one_attempt,
    "job_step_record": lambda k: f"{one_attempt(k)}, 's', '1', NULL, NULL",
    "job_progress": lambda k: f"{one_attempt(k)}, 'm', NULL",
    "job_attempts_repair": lambda k: f"{k.pending}",
}


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


async def explain(conn: Any, name: str, keys: Keys, text: bool = False) -> dict[str, Any]:
    args = STATEMENTS[name](keys)
    tr = conn.transaction()
    await tr.start()
    try:
        raw = await conn.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE s_{name}({args})"
        )
        plan_text = (
            [r[0] for r in await conn.fetch(f"EXPLAIN (COSTS OFF) EXECUTE s_{name}({args})")]
            if text
            else []
        )
    finally:
        await tr.rollback()
    plan = json.loads(raw)[0]
    nodes = plan_nodes(plan["Plan"])
    return {
        "ms": plan["Execution Time"],
        "buffers": sum(
            n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in nodes[:1]
        ),
        "seq": sorted(
            {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}
            - {"leader", "workers"}
        ),
        "plan": plan_text,
    }


async def prepare_all(conn: Any, keys: Keys) -> None:
    for name in STATEMENTS:
        await conn.execute(f"PREPARE s_{name} AS {SQL[name]}")
        for _ in range(6):
            await explain(conn, name, keys)


async def fill(admin: Any, backlog: int) -> None:
    await admin.execute(
        "INSERT INTO pgworker.jobs (type, run_at) "
        "SELECT 't', now() - interval '1 minute' FROM generate_series(1, $1)",
        backlog,
    )
    for n, lease in ((RUNNING, "30 seconds"), (EXPIRED, "-1 minute")):
        await admin.execute(
            f"""WITH j AS (
                INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, worker_id,
                                           lease_expires_at, budget_started_at)
                SELECT 't', 'running', 1, now() - interval '2 minutes', 'other',
                       now() + interval '{lease}', now() - interval '2 minutes'
                FROM generate_series(1, $1)
                RETURNING id, claimed_at, correlation_id)
            INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                               correlation_id, started_at)
            SELECT id, 1, 't', 'default', 'other', correlation_id, claimed_at FROM j""",
            n,
        )
    await admin.execute(
        """WITH j AS (
            INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, finished_at)
            SELECT 't', 'completed', 1, now() - interval '2 days', now() - interval '2 days'
            FROM generate_series(1, $1)
            RETURNING id, claimed_at, correlation_id)
        INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                                           correlation_id, started_at, outcome, finished_at)
        SELECT id, 1, 't', 'default', 'other', correlation_id, claimed_at, 'completed',
               claimed_at FROM j""",
        FINISHED,
    )


async def keys_of(admin: Any, batch: int) -> Keys:
    cols = "SELECT id, attempts, claimed_at FROM pgworker.jobs WHERE status = 'running'"
    running = await admin.fetch(
        f"{cols} AND lease_expires_at > now() ORDER BY random() LIMIT {batch}"
    )
    expired = await admin.fetch(
        f"{cols} AND lease_expires_at < now() ORDER BY random() LIMIT {batch}"
    )
    pending = await admin.fetchval(
        "SELECT id FROM pgworker.jobs WHERE status = 'pending' ORDER BY random() LIMIT 1"
    )
    return Keys(list(running), list(expired), pending)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    admin = await asyncpg.connect(dsn)
    pool = None
    plain = None
    out: dict[str, Any] = {}
    try:
        await pgworker.migrate(admin)
        for table in ("jobs", "job_attempts", "job_steps", "job_milestones", "job_events"):
            await admin.execute(
                f"ALTER TABLE pgworker.{table} SET (autovacuum_enabled = off, "
                "toast.autovacuum_enabled = off)"
            )
        await admin.execute(
            "INSERT INTO pgworker.leader (name, worker_id, elected_at, expires_at) "
            "VALUES ('maintenance', 'bench', now(), now() + interval '1 day')"
        )
        await admin.execute("VACUUM ANALYZE")
        empty = Keys(
            [{"id": -1, "attempts": 1, "claimed_at": datetime.now().astimezone()}],
            [{"id": -2, "attempts": 1, "claimed_at": datetime.now().astimezone()}],
            -3,
        )
        pool = await create_pool(dsn, size=1, keyed=True)
        sessions = {"worker": await pool.acquire(), "plain": await asyncpg.connect(dsn)}
        plain = sessions["plain"]
        for conn in sessions.values():
            await prepare_all(conn, empty)
        await fill(admin, args.backlog)
        keys = await keys_of(admin, args.batch)
        for label, conn in sessions.items():
            for name in STATEMENTS:
                out.setdefault(name, {})[f"{label} cached"] = await explain(
                    conn, name, keys, args.plans
                )
        await admin.execute("VACUUM ANALYZE")
        for label, conn in sessions.items():
            for name in STATEMENTS:
                out[name][f"{label} analysed"] = await explain(conn, name, keys, args.plans)
                await conn.execute(f"DEALLOCATE s_{name}")
                await conn.execute(f"PREPARE s_{name} AS {SQL[name]}")
                out[name][f"{label} fresh"] = await explain(conn, name, keys, args.plans)
        await pool.release(sessions["worker"])
    finally:
        if plain is not None:
            await plain.close()
        if pool is not None:
            await pool.close()
        await admin.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()
    return out


def cell(m: dict[str, Any]) -> str:
    seq = f" seq:{','.join(m['seq'])}" if m["seq"] else ""
    return f"{m['ms']:.2f} ms {m['buffers']} buf{seq}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10, help="attempts per batch statement")
    parser.add_argument("--plans", action="store_true", help="print the plans (COSTS OFF)")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    columns = [f"{s} {w}" for s in ("worker", "plain") for w in ("cached", "analysed", "fresh")]
    print("| statement | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, ms in out.items():
        print(f"| {name} | " + " | ".join(cell(ms[c]) for c in columns) + " |")
    if args.plans:
        for name, ms in out.items():
            for c in columns:
                print(f"\n## {name}: {c}\n" + "\n".join(ms[c]["plan"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
