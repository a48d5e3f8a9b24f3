"""What blocked dependants cost the claim: 10,000 parked jobs (pending, waiting
for their parents: run_at = 'infinity', see migration 0019) of the same type and queue as the
claimed jobs, and of another type, beside the same claims with none.

    PYTHONPATH=. python -m bench.deps_cost [--dsn DSN] [--parked 10000] [--claims 200] [--json FILE]

In a database of its own (`bench_deps_cost`, dropped at the end), with the worker's session
settings, each figure is the median of `--claims` plain claims of 10 jobs (bench/claim_cost.py's
claim, each rolled back) and one EXPLAIN (ANALYZE, BUFFERS) of it: buffers read, rows of jobs
filtered out. "idle" rows claim from a type with no due job: what an idle worker's poll costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import asyncpg

import pgworker
from bench.claim_cost import SERVED_JOBS, add_jobs, fresh, reset, row, served_types

DATABASE = "bench_deps_cost"


async def add_parked(admin: Any, type_: str, n: int) -> None:
    """`n` dependants of `type_`, each waiting for one parent still pending (of a type nobody
    serves, so that the parents stay out of the claims)."""
    parent = await admin.fetchval(
        "INSERT INTO pgworker.jobs (type, has_dependants) VALUES ('parent', true) RETURNING id"
    )
    await admin.execute(
        "INSERT INTO pgworker.jobs (type, run_at, parents, parents_left, on_parent_failure) "
        "SELECT $1, 'infinity', ARRAY[$2::bigint], 1, 'cancel' FROM generate_series(1, $3)",
        type_,
        parent,
        n,
    )
    await admin.execute(
        "INSERT INTO pgworker.job_dependencies (parent_id, child_id) "
        "SELECT $1, id FROM pgworker.jobs WHERE parents IS NOT NULL",
        parent,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    types = served_types(1)
    out: dict[str, Any] = {"rows": {}}
    lines = [
        f"plain claim of up to 10 jobs of type {types[0]!r}, worker session settings; parked = "
        f"{args.parked:,} dependants waiting for a parent",
        "",
        "| case | ms per claim | buffers | jobs rows filtered out | jobs seq scans | claimed |",
        "|---|---|---|---|---|---|",
    ]
    cases = [
        ("20 due, nothing parked", SERVED_JOBS, None),
        (f"20 due, {args.parked:,} parked of the same type and queue", SERVED_JOBS, types[0]),
        (f"20 due, {args.parked:,} parked of another type", SERVED_JOBS, "other"),
        ("idle (nothing due), nothing parked", 0, None),
        (f"idle, {args.parked:,} parked of the same type and queue", 0, types[0]),
        (f"idle, {args.parked:,} parked of another type", 0, "other"),
    ]
    admin = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(admin)
        await admin.execute("ALTER TABLE pgworker.jobs SET (autovacuum_enabled = off)")
        for label, due, parked in cases:
            await reset(admin)
            await admin.execute("TRUNCATE pgworker.job_dependencies")
            if due:
                await add_jobs(admin, types, due, "1 minute")
            if parked is not None:
                await add_parked(admin, parked, args.parked)
            await admin.execute("VACUUM ANALYZE pgworker.jobs")
            m = await fresh(dsn, types, args.claims)
            out["rows"][label] = m
            lines.append(row(label, m))
    finally:
        await admin.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()
    out["table"] = lines
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--json", help="write the figures and plans to this file")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    print("\n".join(out["table"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)


if __name__ == "__main__":
    main()
