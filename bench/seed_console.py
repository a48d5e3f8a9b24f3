"""Seed a scratch database with a big history, to measure the operator console's queries (issue
25): its pages, the counts they poll and the charts' `/stats`.

    PYTHONPATH=. python -m bench.seed_console [--dsn DSN] [--database NAME] [--jobs 1000000]
        [--attempts 5000000] [--hours 168] [--queues 5] [--types 20] [--pending 2000]
        [--failed 0.1] [--explain] [--roll-up] [--reuse]

It drops and creates the database `--database` (default `bench_console`) on the server of
`--dsn`, migrates it, then writes with `generate_series` (one INSERT each, no round trip per
row):

- `--jobs` jobs, created evenly over the last `--hours` hours, oldest first, in `--queues` queues
  (`q0`, `q1`, ...) and `--types` types (`t0`, ...); the newest `--pending` are pending, the
  others ended: failed for a `--failed` share, completed for the rest;
- `--attempts` attempts spread over those jobs (each ended job gets `attempts // jobs` or one
  more, numbered from 1), the earlier ones `retried`, the last one `completed` or `failed` as its
  job; each starts a little after the previous one (waits of 0 to 3 s, runs of 5 to 500 ms).

Rows are written in time order, as a live system writes them; a table that has seen many
updates is less tidy (see docs/operations/console.md). With `--roll-up` it then rolls the last
day up into the charts' per-minute rollup (migration 24) as the maintenance leader does, and says
what each minute cost; with `--explain` it prints the plans and times of the charts' statement
(an hour and a day, overall, one queue, one type) and of rolling up one minute. `--reuse` skips
the seeding and works on the database as it is (migrated to the latest version first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import asyncpg

import pgworker
from pgworker._db import files
from pgworker._db.queries import queries
from pgworker._maintenance import rollup
from pgworker._web.charts import DIRECT_MINUTES, WINDOWS

JOBS = """
INSERT INTO pgworker.jobs (type, queue, payload, status, retry_count, max_retries, attempts,
                           correlation_id, run_at, claimed_at, worker_id, error, created_at,
                           updated_at, finished_at)
SELECT 't' || (i % $2), 'q' || (i % $3), jsonb_build_object('n', i),
       CASE WHEN i > $1 - $5 THEN 'pending'
            WHEN (i::bigint * 7919) % 1000 < $6::float8 * 1000 THEN 'failed' ELSE 'completed' END,
       greatest(n - 1, 0), 25, CASE WHEN i > $1 - $5 THEN 0 ELSE n END,
       'c' || i, created + (n - 1) * interval '2 s',
       CASE WHEN i > $1 - $5 THEN NULL ELSE created + (n - 1) * interval '2 s' END,
       CASE WHEN i > $1 - $5 THEN NULL ELSE 'w' || (i % 8) END,
       CASE WHEN i <= $1 - $5 AND (i::bigint * 7919) % 1000 < $6::float8 * 1000
            THEN 'ValueError: remote down' END,
       created, created,
       CASE WHEN i > $1 - $5 THEN NULL ELSE created + n * interval '2 s' END
FROM generate_series(1, $1) AS i
CROSS JOIN LATERAL (
    SELECT $7::timestamptz + (i - 1) * ($4::float8 / $1) * interval '1 s' AS created,
           $8::integer + CASE WHEN i % $1 < $9 THEN 1 ELSE 0 END AS n
) AS s
ORDER BY i
"""

ATTEMPTS = """
INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                   outcome, started_at, finished_at, error_type, error_message)
SELECT j.id, k, j.type, j.queue, j.worker_id, j.correlation_id,
       CASE WHEN k < j.attempts THEN 'retried' ELSE j.status END,
       j.created_at + (k - 1) * interval '2 s' + (j.id % 3000) * interval '1 ms',
       j.created_at + (k - 1) * interval '2 s' + (j.id % 3000) * interval '1 ms'
           + (5 + j.id % 495) * interval '1 ms',
       CASE WHEN k < j.attempts OR j.status = 'failed' THEN 'ValueError' END,
       CASE WHEN k < j.attempts OR j.status = 'failed' THEN 'remote down' END
FROM pgworker.jobs AS j
CROSS JOIN LATERAL generate_series(1, j.attempts) AS k
WHERE j.status <> 'pending'
ORDER BY j.id, k
"""


def _dsn_of(dsn: str, database: str) -> str:
    base, _, _ = dsn.rpartition("/")
    return f"{base}/{database}"


async def seed(args: argparse.Namespace) -> str:
    dsn = _dsn_of(args.dsn, args.database)
    if not args.reuse:
        admin = await asyncpg.connect(args.dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{args.database}"')
            await admin.execute(f'CREATE DATABASE "{args.database}"')
        finally:
            await admin.close()
    conn = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(conn)
        if not args.reuse:
            await _fill(conn, args)
        if args.roll_up:
            await roll_up(conn)
        if args.explain:
            await explain(conn)
    finally:
        await conn.close()
    return dsn


async def _fill(conn: asyncpg.Connection, args: argparse.Namespace) -> None:
    ended = args.jobs - args.pending
    per_job, extra = divmod(args.attempts, max(ended, 1))
    start = datetime.now(UTC) - timedelta(hours=args.hours)
    began = time.perf_counter()
    await conn.execute(
        JOBS,
        args.jobs,
        args.types,
        args.queues,
        args.hours * 3600.0,
        args.pending,
        args.failed,
        start,
        max(per_job, 1),
        extra,
    )
    print(f"jobs: {args.jobs:,} in {time.perf_counter() - began:.1f} s")
    began = time.perf_counter()
    await conn.execute(ATTEMPTS)
    count = await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts")
    print(f"attempts: {count:,} in {time.perf_counter() - began:.1f} s")
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    await conn.execute("VACUUM ANALYZE pgworker.job_attempts")


async def roll_up(conn: asyncpg.Connection) -> None:
    """Roll up every minute due, as the maintenance leader does (without its fence)."""
    q = queries("pgworker")
    minutes = attempts = 0
    took: list[float] = []
    while due := await q.stats_rollup_due(
        conn,
        rollup.ROLLUP_SETTLE,
        rollup.ROLLUP_RECHECK,
        rollup.ROLLUP_REACH,
        rollup.ROLLUP_MINUTES,
    ):
        for minute in due:
            began = time.perf_counter()
            row = await q.stats_rollup(conn, minute, None)
            took.append(time.perf_counter() - began)
            minutes += 1
            attempts += row["attempts"]
    await conn.execute("ANALYZE pgworker.stats_minutes")
    await conn.execute("ANALYZE pgworker.stats_rollup")
    if took:
        took.sort()
        print(
            f"rolled up {minutes:,} minutes ({attempts:,} attempts) in {sum(took):.1f} s: "
            f"median {took[len(took) // 2] * 1000:.1f} ms a minute, "
            f"worst {took[-1] * 1000:.1f} ms"
        )


def _literal(value: object) -> str:
    """A bench parameter written as SQL (EXECUTE takes no bind parameters)."""
    if value is None:
        return "NULL"
    if isinstance(value, datetime):
        return f"'{value.isoformat()}'::timestamptz"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


async def _explain(
    conn: asyncpg.Connection,
    sql: str,
    title: str,
    params: tuple[object, ...],
    before: str | None = None,
) -> None:
    """EXPLAIN ANALYZE of one execution, in a transaction rolled back, planned as the pools plan
    (connection.create_pool) with the settings of stats_plan.sql."""
    undone = conn.transaction()
    await undone.start()
    try:
        if before is not None:
            await conn.execute(before)
        await queries("pgworker").stats_plan(conn)
        await conn.execute(f"PREPARE console_stat AS {sql}")
        args = ", ".join(_literal(p) for p in params)
        began = time.perf_counter()
        plan = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE console_stat({args})")
        took = (time.perf_counter() - began) * 1000
    finally:
        await undone.rollback()
        with contextlib.suppress(asyncpg.PostgresError):  # PREPARE outlives the rollback
            await conn.execute("DEALLOCATE console_stat")
    print(f"--- {title}: {took:.0f} ms")
    print("\n".join(r[0] for r in plan))


async def explain(conn: asyncpg.Connection) -> None:
    """The plans and times of the charts' statement, as /stats runs it, and of one minute's
    rollup, as the maintenance leader runs it (in a transaction rolled back)."""
    sql = files.queries("pgworker")
    cases = [
        ("hour", None, None),
        ("hour", "q1", None),
        ("hour", None, "t3"),
        ("day", None, None),
        ("day", "q1", None),
        ("day", None, "t3"),
    ]
    # As the pools plan (connection.create_pool); stats_plan.sql then turns bitmap scans on.
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute("SET enable_bitmapscan = off")
    for window, queue, type_ in cases:
        length, bucket = WINDOWS[window]
        until = datetime.now(UTC)
        first = int(until.timestamp()) // bucket * bucket - length + bucket
        since = datetime.fromtimestamp(first, UTC)
        params = (since, until, bucket, queue or "", type_ or "", DIRECT_MINUTES)
        title = f"stats_window window={window} queue={queue} type={type_}"
        await _explain(conn, sql["stats_window"], title, params)
        if window == "day" and queue is None and type_ is None:
            # Right after the upgrade (nothing rolled up): the newest minutes read directly.
            title += f", no rollup ({DIRECT_MINUTES} minutes from job_attempts)"
            empty = "DELETE FROM pgworker.stats_rollup"
            await _explain(conn, sql["stats_window"], title, params, before=empty)
    minute = await conn.fetchval(
        "SELECT max(minute) FROM pgworker.stats_minutes"
        " WHERE queue = '' AND type = '' AND completed + failed > 0"
    )
    if minute is not None:
        await _explain(conn, sql["stats_rollup"], f"stats_rollup minute={minute}", (minute, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", default="bench_console")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--attempts", type=int, default=5_000_000)
    parser.add_argument("--hours", type=float, default=168.0)
    parser.add_argument("--queues", type=int, default=5)
    parser.add_argument("--types", type=int, default=20)
    parser.add_argument("--pending", type=int, default=2000)
    parser.add_argument("--failed", type=float, default=0.1)
    parser.add_argument("--explain", action="store_true", help="print the queries' plans")
    parser.add_argument("--roll-up", action="store_true", help="roll the last day up first")
    parser.add_argument("--reuse", action="store_true", help="keep the database as it is")
    args = parser.parse_args()
    if args.jobs < 1 or args.attempts < 0 or args.hours <= 0 or not 0 <= args.failed <= 1:
        parser.error("--jobs must be at least 1, --hours more than 0, --failed from 0 to 1")
    if args.pending >= args.jobs:
        parser.error("--pending must be fewer than --jobs")
    print(asyncio.run(seed(args)))


if __name__ == "__main__":
    main()
