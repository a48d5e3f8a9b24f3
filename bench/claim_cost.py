"""What one claim costs a worker when its queue holds pending jobs of types it does not serve, and
when its plan was made on an empty table.

    PYTHONPATH=. python -m bench.claim_cost [--dsn DSN] [--backlog 100000] [--types 1,10,100]

In a database of its own (`bench_claim_cost`, dropped at the end), with the worker's session
settings (its pool) and the claim it runs (`Queries.job_claim`, 10 jobs of queue `default`):

- for a worker serving 1, 10 and 100 types, each with 20 due jobs: the claim with no other pending
  job, then with `--backlog` pending jobs of a type nobody serves in the same queue, older than
  every served one (so first in claim order);
- a worker whose claim was planned on the empty table, after `--backlog` jobs of a type it serves
  arrive, beside a worker started on the full table.

Each figure is the median of `--claims` claims, each rolled back so that every one meets the same
table; `buffers` is the shared buffers (hit + read) of one EXPLAIN (ANALYZE, BUFFERS) of the
claim as a prepared statement of the same session. Autovacuum is off on the benchmark's tables,
so that no ANALYZE replaces a plan during the run. Run it with another checkout's pgworker on
PYTHONPATH to measure that one: the script uses only what every version since 0.1 has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import asyncpg

import pgworker
from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries

DATABASE = "bench_claim_cost"
SERVED_JOBS = 20
LIMIT = 10
SQL = files.queries("pgworker")["job_claim"]
# Since migration 11 the served (type, version) pairs come as two arrays; before, version 1 of the
# types in $9 and the other versions as `type@version` in $10.
PAIRS = "$10::integer[]" in SQL
# Since migration 15, whether queues with limits are claimed too ($11).
LIMITED = "$11::boolean" in SQL
# Since the worker claims ahead per type, the most jobs of each type ($12; NULL: the limit).
MOST = "$12::integer[]" in SQL
PREPARE = (
    "PREPARE claim(text[], text[], int, text, float8, int[], text, text, text[], "
    f"{'integer[]' if PAIRS else 'text[]'}{', boolean' if LIMITED else ''}"
    f"{', integer[]' if MOST else ''}) AS "
)
LAST = (", false" if LIMITED else "") + (", NULL" if MOST else "") + ")"


def served_types(n: int) -> list[str]:
    return [f"served_{i}" for i in range(n)]


async def worker_pool(dsn: str) -> asyncpg.Pool:
    """A pool with the worker's session settings, as this checkout's worker makes it."""
    try:
        return await create_pool(dsn, size=1, keyed=True)  # type: ignore[call-arg]
    except TypeError:  # a checkout from before `keyed`
        return await create_pool(dsn, size=1)


async def claim_once(conn: Any, types: list[str]) -> int:
    rows = await queries("pgworker").job_claim(
        conn,
        queues=["default"],
        types=types,
        default_max_retries=[3] * len(types),
        limit=LIMIT,
        worker_id="bench",
        lease=30.0,
        code_version=None,
        version_1_types=types,
        other_versions=[],
    )
    return len(rows)


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += plan_nodes(child)
    return found


async def explain(conn: Any, types: list[str]) -> dict[str, Any]:
    """One EXPLAIN (ANALYZE, BUFFERS) of the claim prepared in this session (rolled back)."""
    array = "{" + ",".join(types) + "}"
    retries = "{" + ",".join("3" for _ in types) + "}"
    versions = retries.replace("3", "1") if PAIRS else "{}"
    tr = conn.transaction()
    await tr.start()
    try:
        raw = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim("
            f"'{{default}}', '{array}', {LIMIT}, 'bench', 30, '{retries}', NULL, 'off', "
            f"'{array}', '{versions}'{LAST}"
        )
        text = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE claim("
            f"'{{default}}', '{array}', {LIMIT}, 'bench', 30, '{retries}', NULL, 'off', "
            f"'{array}', '{versions}'{LAST}"
        )
    finally:
        await tr.rollback()
    plan = json.loads(raw)[0]
    top = plan["Plan"]
    nodes = plan_nodes(top)
    return {
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "rows_removed": sum(
            n.get("Rows Removed by Filter", 0) for n in nodes if n.get("Relation Name") == "jobs"
        ),
        "seq_scans_of_jobs": sum(
            1 for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
        ),
        "execution_ms": plan["Execution Time"],
        "plan": [r[0] for r in text],
    }


async def measure(conn: Any, types: list[str], claims: int) -> dict[str, Any]:
    """The median wall time of `claims` claims (each rolled back) and one EXPLAIN."""
    times = []
    claimed = 0
    for _ in range(claims):
        tr = conn.transaction()
        await tr.start()
        try:
            began = time.perf_counter()
            claimed = await claim_once(conn, types)
            times.append(time.perf_counter() - began)
        finally:
            await tr.rollback()
    result = await explain(conn, types)
    result["ms"] = statistics.median(times) * 1000
    result["claimed"] = claimed
    return result


def claim_sql(served: int) -> str:
    """The claim a worker serving `served` types runs (one statement for all before
    job_claim_wide.sql)."""
    try:
        from pgworker._db.queries import claim_statement
    except ImportError:
        return SQL
    return files.queries("pgworker")[claim_statement(served, LIMIT)]


async def prepared(dsn: str, served: int) -> tuple[asyncpg.Pool, Any]:
    """A worker's pool, its connection, and the claim of a worker serving `served` types
    prepared (as SQL) in that session."""
    pool = await worker_pool(dsn)
    conn = await pool.acquire()
    await conn.execute(PREPARE + claim_sql(served))
    return pool, conn


async def fresh(dsn: str, types: list[str], claims: int) -> dict[str, Any]:
    pool, conn = await prepared(dsn, len(types))
    try:
        return await measure(conn, types, claims)
    finally:
        await pool.release(conn)
        await pool.close()


async def reset(admin: Any) -> None:
    await admin.execute("TRUNCATE pgworker.jobs, pgworker.job_attempts")


async def add_jobs(admin: Any, types: list[str], per_type: int, age: str) -> None:
    await admin.execute(
        "INSERT INTO pgworker.jobs (type, run_at) "
        "SELECT t, now() - $2::text::interval FROM unnest($1::text[]) AS t, generate_series(1, $3)",
        types,
        age,
        per_type,
    )


def row(label: str, m: dict[str, Any]) -> str:
    return (
        f"| {label} | {m['ms']:.3f} | {m['buffers']} | {m['rows_removed']} | "
        f"{m['seq_scans_of_jobs']} | {m['claimed']} |"
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    out: dict[str, Any] = {"rows": {}}
    lines = [
        f"claim of {LIMIT} jobs, worker session settings; backlog = {args.backlog:,} pending "
        "jobs of an unserved type in the same queue",
        "",
        "| case | ms per claim | buffers | jobs rows filtered out | jobs seq scans | claimed |",
        "|---|---|---|---|---|---|",
    ]
    admin = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(admin)
        for table in ("jobs", "job_attempts"):
            await admin.execute(
                f"ALTER TABLE pgworker.{table} SET (autovacuum_enabled = off, "
                "toast.autovacuum_enabled = off)"
            )
        for n in args.types:
            types = served_types(n)
            await reset(admin)
            await add_jobs(admin, types, SERVED_JOBS, "1 minute")
            await admin.execute("VACUUM ANALYZE pgworker.jobs")
            none = await fresh(dsn, types, args.claims)
            await add_jobs(admin, ["unserved"], args.backlog, "1 hour")
            await admin.execute("VACUUM ANALYZE pgworker.jobs")
            backlog = await fresh(dsn, types, args.claims)
            out["rows"][f"{n} types, no backlog"] = none
            out["rows"][f"{n} types, backlog"] = backlog
            lines.append(row(f"{n} types served, no backlog", none))
            lines.append(row(f"{n} types served, backlog", backlog))
            lines.append(f"| ratio backlog / none | {backlog['ms'] / none['ms']:.2f} | | | | |")
        # Started on an empty table (analysed as empty), then the jobs arrive.
        types = served_types(1)
        await reset(admin)
        await admin.execute("VACUUM ANALYZE pgworker.jobs")
        pool, conn = await prepared(dsn, len(types))
        try:
            await measure(conn, types, 3)  # plans the claim on the empty table
            await add_jobs(admin, types, args.backlog, "1 minute")
            stale = await measure(conn, types, args.claims)
        finally:
            await pool.release(conn)
            await pool.close()
        await admin.execute("VACUUM ANALYZE pgworker.jobs")
        full = await fresh(dsn, types, args.claims)
        out["rows"]["started on empty"] = stale
        out["rows"]["started on full"] = full
        lines.append(row(f"planned on empty, {args.backlog:,} served jobs arrive", stale))
        lines.append(row(f"planned on {args.backlog:,} served jobs", full))
        lines.append(f"| ratio empty / full | {stale['ms'] / full['ms']:.2f} | | | | |")
    finally:
        await admin.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()
    out["table"] = lines
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument(
        "--types", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100]
    )
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--json", help="also write every figure and plan to this file")
    parser.add_argument("--plans", action="store_true", help="print the EXPLAIN of each case")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    print("\n".join(out["table"]))
    if args.plans:
        for name, m in out["rows"].items():
            print(f"\n## {name}\n")
            print("\n".join(m["plan"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
