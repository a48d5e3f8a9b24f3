"""What a limited claim costs beside the plain claim (issue 23): a task with `max_running`, with
`max_running_per_key` and 100 concurrency keys, with a `rate_limit`.

    PYTHONPATH=. python -m bench.limit_cost [--dsn DSN] [--backlog 100000] [--claims 200]
        [--keys 100] [--others-running 1000] [--plans [LABEL|all]] [--json FILE]

In a database of its own (`bench_limit_cost`, dropped at the end), with the worker's session
settings (its pool: generic plans, no sequential scan), the cost of one claim of 10 jobs of queue
`default`, each case on a table holding only its own jobs:

- plain: a task without options (`Queries.job_claim`), 20 due jobs;
- max_running=5: 20 due jobs, then the same with 3 of the task's jobs already running;
- max_running_per_key=1: 100 concurrency keys with 100 pending jobs each (10,000), the
  round-robin's cursor in the middle of them (a task served for a while);
- rate_limit 1000/s: 20 due jobs, the rate window holding 300 starts of the last 300 ms (written
  again before each claim, so that none leaves the 1-second window during the run);

then every case again with `--backlog` pending jobs of a type nobody serves in the same queue,
older than the served ones, and again with `--others-running` running jobs of another type in
the same queue (the running counts of `max_running` read them).

A limited claim is what `LimitedClaims.claim` runs for one task: BEGIN, `limits_lock` (the
advisory lock of the task's limit), `job_claim_limited`; its figure counts those three round
trips, the plain claim's its one statement (the worker runs it without a transaction of its
own); neither counts the commit. Each figure is the median (and
p90) of `--claims` claims, each rolled back so that every one meets the same table; `buffers`
is the shared buffers (hit + read) of one EXPLAIN (ANALYZE, BUFFERS) of the claim statement,
prepared in the same session. Autovacuum is off on the benchmark's tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

import pgworker
from bench.claim_cost import LIMIT, SERVED_JOBS, claim_once, plan_nodes, prepared, worker_pool
from bench.claim_cost import explain as explain_plain
from pgworker._db import files
from pgworker._db.queries import queries

DATABASE = "bench_limit_cost"
PER_KEY = 100
RATE = (1000, 1)
RATE_STARTS = 300
PREPARE_LIMITED = (
    "PREPARE limited(text, text, integer, integer, text, float8, integer, text, text, "
    "integer, integer, integer, integer, boolean) AS "
    + files.queries("pgworker")["job_claim_limited"]
)


@dataclass(frozen=True)
class Case:
    label: str
    type: str
    max_running: int | None = None
    per_key: int | None = None
    rate: tuple[int, int] | None = None
    running: int = 0
    keys: int = 0

    @property
    def limited(self) -> bool:
        return self.max_running is not None or self.per_key is not None or self.rate is not None


def cases(keys: int) -> list[Case]:
    return [
        Case("plain (no option)", "plain"),
        Case("max_running=5", "capped", max_running=5),
        Case("max_running=5, 3 running", "capped", max_running=5, running=3),
        Case(f"max_running_per_key=1, {keys} keys", "keyed", per_key=1, keys=keys),
        Case(f"rate_limit {RATE[0]}/s, {RATE_STARTS} recent starts", "rated", rate=RATE),
    ]


@dataclass(frozen=True)
class Around:
    """What else the table holds: pending jobs of an unserved type, and running jobs of another
    type, both in the same queue."""

    backlog: int = 0
    running: int = 0

    @property
    def label(self) -> str:
        parts = [f"backlog {self.backlog:,}"] if self.backlog else []
        parts += [f"{self.running:,} others running"] if self.running else []
        return ", ".join(parts)


def literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def limited_args(case: Case) -> list[Any]:
    """job_claim_limited's parameters, as Queries.job_claim_limited passes them."""
    rate = case.rate or (None, None)
    return [
        "default",
        case.type,
        1,
        LIMIT,
        "bench",
        30.0,
        3,
        None,
        "off",
        case.max_running,
        case.per_key,
        *rate,
        False,
    ]


async def lock(conn: Any, case: Case) -> None:
    await queries("pgworker").limits_lock(conn, ["default"], [case.type])


async def claim_limited(conn: Any, case: Case) -> int:
    rows = await queries("pgworker").job_claim_limited(
        conn,
        queue="default",
        type=case.type,
        version=1,
        limit=LIMIT,
        worker_id="bench",
        lease=30.0,
        max_retries=3,
        code_version=None,
        durable=False,
        max_running=case.max_running,
        max_running_per_key=case.per_key,
        rate=case.rate,
        queue_locked=False,
    )
    return len(rows)


async def refill_window(conn: Any, case: Case) -> None:
    """The rate window with RATE_STARTS starts of the last RATE_STARTS ms (one a millisecond)."""
    if case.rate is not None:
        await conn.execute(
            "INSERT INTO pgworker.rate_windows (name, starts) "
            "SELECT $1, array_agg(now() - i * interval '1 ms' ORDER BY i DESC) "
            "FROM generate_series(1, $2) AS i "
            "ON CONFLICT (name) DO UPDATE SET starts = EXCLUDED.starts",
            f"type:{case.type}",
            RATE_STARTS,
        )


async def explain_limited(conn: Any, case: Case) -> dict[str, Any]:
    """One EXPLAIN (ANALYZE, BUFFERS) of job_claim_limited after limits_lock (rolled back)."""
    call = "EXECUTE limited(" + ", ".join(literal(a) for a in limited_args(case)) + ")"

    async def once(explain: str) -> list[Any]:
        # Each in a transaction of its own: the second would see the first's claims.
        tr = conn.transaction()
        await tr.start()
        try:
            await refill_window(conn, case)
            await lock(conn, case)
            return [r[0] for r in await conn.fetch(f"{explain} {call}")]
        finally:
            await tr.rollback()

    raw = (await once("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"))[0]
    text = await once("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)")
    plan = json.loads(raw)[0]
    top = plan["Plan"]
    nodes = plan_nodes(top)
    return {
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "seq_scans_of_jobs": sum(
            1 for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
        ),
        "execution_ms": plan["Execution Time"],
        "plan": text,
    }


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


async def timed(
    conn: Any, case: Case, claims: int, claim: Callable[[], Awaitable[int]]
) -> dict[str, Any]:
    """`claims` claims, each in a transaction rolled back: the ms per claim (median, p90) and of
    its claim statement alone (median), and the jobs the last one claimed."""
    totals, statements = [], []
    claimed = 0
    for _ in range(claims):
        tr = conn.transaction()
        began = time.perf_counter()
        await tr.start()
        begin = time.perf_counter() - began
        try:
            await refill_window(conn, case)
            started = time.perf_counter()
            if case.limited:
                await lock(conn, case)
            middle = time.perf_counter()
            claimed = await claim()
            ended = time.perf_counter()
        finally:
            await tr.rollback()
        # The plain claim runs without a BEGIN of its own in the worker; a limited claim needs one.
        totals.append((begin if case.limited else 0.0) + ended - started)
        statements.append(ended - middle)
    return {
        "ms": statistics.median(totals) * 1000,
        "p90_ms": p90(totals) * 1000,
        "statement_ms": statistics.median(statements) * 1000,
        "claimed": claimed,
    }


async def measure(dsn: str, case: Case, claims: int) -> dict[str, Any]:
    """On a new worker connection (its plans made on the table as it is now)."""
    if not case.limited:
        pool, conn = await prepared(dsn)  # PREPAREs the plain claim for its EXPLAIN
    else:
        pool = await worker_pool(dsn)
        conn = await pool.acquire()
        await conn.execute(PREPARE_LIMITED)
    try:
        if case.limited:
            result = await timed(conn, case, claims, lambda: claim_limited(conn, case))
            result |= await explain_limited(conn, case)
        else:
            result = await timed(conn, case, claims, lambda: claim_once(conn, [case.type]))
            result |= await explain_plain(conn, [case.type])
        return result
    finally:
        await pool.release(conn)
        await pool.close()


async def fill(admin: Any, case: Case, around: Around) -> None:
    """The case's jobs alone in the table (and what is around), vacuumed and analysed."""
    await admin.execute(
        "TRUNCATE pgworker.jobs, pgworker.job_attempts, pgworker.rate_windows, pgworker.key_cursors"
    )
    if case.per_key is not None:
        await admin.execute(
            "INSERT INTO pgworker.jobs (type, concurrency_key, run_at) "
            "SELECT $1, 'customer-' || k, now() - interval '1 minute' + j * interval '1 ms' "
            "FROM generate_series(1, $2) AS k, generate_series(1, $3) AS j",
            case.type,
            case.keys,
            PER_KEY,
        )
        await admin.execute(
            "INSERT INTO pgworker.key_cursors (queue, type, last_key) "
            "VALUES ('default', $1, 'customer-' || ($2::int / 2))",
            case.type,
            case.keys,
        )
    else:
        await admin.execute(
            "INSERT INTO pgworker.jobs (type, run_at) "
            "SELECT $1, now() - interval '1 minute' FROM generate_series(1, $2)",
            case.type,
            SERVED_JOBS,
        )
    if case.running:
        await admin.execute(
            "INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, worker_id, "
            "lease_expires_at, heartbeat_at, run_at) "
            "SELECT $1, 'running', 1, now(), 'other', now() + interval '1 hour', now(), "
            "now() - interval '2 minutes' FROM generate_series(1, $2)",
            case.type,
            case.running,
        )
    if around.backlog:
        await admin.execute(
            "INSERT INTO pgworker.jobs (type, run_at) "
            "SELECT 'unserved', now() - interval '1 hour' FROM generate_series(1, $1)",
            around.backlog,
        )
    if around.running:
        await admin.execute(
            "INSERT INTO pgworker.jobs (type, status, attempts, claimed_at, worker_id, "
            "lease_expires_at, heartbeat_at, run_at) "
            "SELECT 'elsewhere', 'running', 1, now(), 'other', now() + interval '1 hour', now(), "
            "now() - interval '2 minutes' FROM generate_series(1, $1)",
            around.running,
        )
    await admin.execute("VACUUM ANALYZE pgworker.jobs")
    await admin.execute("VACUUM ANALYZE pgworker.key_cursors")


def line(label: str, m: dict[str, Any], plain: dict[str, Any], none: dict[str, Any] | None) -> str:
    ratio = "" if m is plain else f"{m['ms'] / plain['ms']:.2f}"
    growth = "" if none is None else f"{m['ms'] / none['ms']:.2f}"
    return (
        f"| {label} | {m['ms']:.3f} | {m['p90_ms']:.3f} | {m['statement_ms']:.3f} | "
        f"{m['buffers']} | {m['seq_scans_of_jobs']} | {m['claimed']} | {ratio} | {growth} |"
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    dsn = args.dsn.rsplit("/", 1)[0] + "/" + DATABASE
    out: dict[str, Any] = {"rows": {}}
    all_cases = cases(args.keys)
    arounds = [Around(), Around(backlog=args.backlog)]
    if args.others_running:
        arounds.append(Around(running=args.others_running))
    admin = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(admin)
        for table in ("jobs", "job_attempts", "rate_windows", "key_cursors"):
            await admin.execute(
                f"ALTER TABLE pgworker.{table} SET (autovacuum_enabled = off, "
                "toast.autovacuum_enabled = off)"
            )
        for around in arounds:
            for case in all_cases:
                await fill(admin, case, around)
                out["rows"][(case.label, around)] = await measure(dsn, case, args.claims)
    finally:
        await admin.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()
    rows = out["rows"]
    lines = [
        f"claim of {LIMIT} jobs of queue `default`, worker session settings, median of "
        f"{args.claims} claims each rolled back; backlog: pending jobs of an unserved type in "
        "the same queue; others running: running jobs of another type in the same queue",
        "",
        "| case | ms per claim | p90 ms | claim statement ms | buffers | jobs seq scans | "
        "claimed | × plain | × alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for around in arounds:
        plain = rows[(all_cases[0].label, around)]
        for case in all_cases:
            m = rows[(case.label, around)]
            label = ", ".join(x for x in (case.label, around.label) if x)
            alone = rows[(case.label, arounds[0])] if around != arounds[0] else None
            lines.append(line(label, m, plain, alone))
    out["table"] = lines
    out["rows"] = {
        " / ".join(x for x in (label, a.label) if x): m for (label, a), m in rows.items()
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--keys", type=int, default=100, help="the per-key case's keys")
    parser.add_argument(
        "--others-running",
        type=int,
        default=1000,
        help="also every case with this many running jobs of another type in the queue (0: not)",
    )
    parser.add_argument("--json", help="also write every figure and plan to this file")
    parser.add_argument(
        "--plans",
        nargs="?",
        const="per_key=1",
        help="print the EXPLAIN of the cases whose label contains this (default: the per-key "
        "case); `all` for every case",
    )
    args = parser.parse_args()
    out = asyncio.run(run(args))
    print("\n".join(out["table"]))
    if args.plans:
        for name, m in out["rows"].items():
            if args.plans == "all" or args.plans in name:
                print(f"\n## {name}\n")
                print("\n".join(m["plan"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
