"""What bounds enqueueing (bulk enqueue against the floor's COPY, and the wake-up's
enqueue): how much of it is the `jobs` table itself, and how much pgworker's code.

    PYTHONPATH=. python -m bench.enqueue_cost [--dsn DSN] [--jobs N] [--rounds 5] [--singles 300]

In a database of its own (`bench_enqueue_cost`, dropped at the end):

- **Bulk**: `--jobs` no-op jobs in chunks of 5,000, as `make bench`'s W1 enqueues them: the floor's
  COPY into its own table (`bench/floor.py`), a raw binary COPY of the same columns pgworker's
  COPY sends straight into `pgworker.jobs` (ids drawn before, no Python per job but the
  records), and `pgworker.enqueue_many`. Then the raw COPY again, the table stripped a piece at a
  time (the NOTIFY trigger, the CHECK constraints, the partial indexes that a pending job does not
  enter, the BRIN index, the claim index): what each piece of the table costs a COPY.
- **One durable enqueue after 20 ms idle** (what W2's producer does, 50 a second): the floor's
  insert-and-notify statement, a raw INSERT into `pgworker.jobs` (its trigger notifies), and
  `pgworker.enqueue`, taken in turns; then `pgworker.enqueue`'s own parts (its Python before the
  statement, the statement, the result).

Medians of `--rounds` rounds (bulk) and of `--singles` enqueues (one at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import asyncpg

import pgworker
from bench import floor
from pgworker._db.queries import queries
from pgworker.enqueue import _columns, _fields, _payload, _result

DATABASE = "bench_enqueue_cost"
CHUNK = 5_000
COLUMNS = ["id", "type", "queue", "payload", "priority", "max_retries", "version", "correlation_id"]
STRIPPED = [
    ("without the NOTIFY trigger", "ALTER TABLE pgworker.jobs DISABLE TRIGGER jobs_notify"),
    (
        "and without its CHECK constraints",
        """DO $$
        DECLARE c record;
        BEGIN
            FOR c IN SELECT conname FROM pg_constraint
                     WHERE conrelid = 'pgworker.jobs'::regclass AND contype = 'c' LOOP
                EXECUTE format('ALTER TABLE pgworker.jobs DROP CONSTRAINT %I', c.conname);
            END LOOP;
        END $$""",
    ),
    (
        "and without the partial indexes a pending job does not enter",
        "DROP INDEX pgworker.jobs_claim_key_idx, pgworker.jobs_finished_idx, "
        "pgworker.jobs_idempotency_key_idx, pgworker.jobs_lease_idx, "
        "pgworker.jobs_needs_attention_idx, pgworker.jobs_unique_idx",
    ),
    ("and without the BRIN index of created_at", "DROP INDEX pgworker.jobs_created_idx"),
    ("and without the claim index", "DROP INDEX pgworker.jobs_claim_type_idx"),
]


async def _timed(work: Any) -> float:
    t = time.perf_counter()
    await work
    return time.perf_counter() - t


async def floor_copy(conn: asyncpg.Connection, n: int) -> float:
    await conn.execute("TRUNCATE floor_jobs")
    return n / await _timed(
        conn.copy_records_to_table("floor_jobs", records=[("{}",)] * n, columns=["payload"])
    )


async def raw_copy(conn: asyncpg.Connection, n: int) -> float:
    """COPY of what pgworker's COPY sends, in binary, straight into the table."""
    await conn.execute("TRUNCATE pgworker.jobs CASCADE")
    ids = [
        r[0]
        for r in await conn.fetch(
            "SELECT nextval(pg_get_serial_sequence('pgworker.jobs', 'id')) "
            "FROM generate_series(1, $1)",
            n,
        )
    ]
    records = [(i, "noop", "default", "{}", 0, None, 1, str(uuid.uuid4())) for i in ids]

    async def copy() -> None:
        for k in range(0, n, CHUNK):
            await conn.copy_records_to_table(
                "jobs", schema_name="pgworker", records=records[k : k + CHUNK], columns=COLUMNS
            )

    return n / await _timed(copy())


async def library(conn: asyncpg.Connection, n: int) -> float:
    await conn.execute("TRUNCATE pgworker.jobs CASCADE")

    async def enqueue() -> None:
        for k in range(0, n, CHUNK):
            specs = [pgworker.JobSpec("noop", {}) for _ in range(min(CHUNK, n - k))]
            await pgworker.enqueue_many(conn, specs)

    return n / await _timed(enqueue())


async def bulk(conn: asyncpg.Connection, args: argparse.Namespace) -> list[str]:
    rates: dict[str, list[float]] = {"floor": [], "raw": [], "library": []}
    for r in range(args.rounds):
        order = list(rates) if r % 2 == 0 else list(rates)[::-1]
        for name in order:
            fn = {"floor": floor_copy, "raw": raw_copy, "library": library}[name]
            rates[name].append(await fn(conn, args.jobs))
    med = {k: statistics.median(v) for k, v in rates.items()}
    lines = [
        f"bulk enqueue of {args.jobs:,} no-op jobs, chunks of {CHUNK:,}, medians of "
        f"{args.rounds} rounds",
        "",
        "| what | jobs/s | / the floor's COPY |",
        "|---|---:|---:|",
        f"| the floor's COPY into its table | {med['floor']:,.0f} | 1.00× |",
        f"| raw COPY into pgworker.jobs | {med['raw']:,.0f} | {med['raw'] / med['floor']:.2f}× |",
        f"| pgworker.enqueue_many | {med['library']:,.0f} | {med['library'] / med['floor']:.2f}× |",
    ]
    for label, ddl in STRIPPED:
        await conn.execute(ddl)
        rate = statistics.median([await raw_copy(conn, args.jobs) for _ in range(args.rounds)])
        lines.append(f"| raw COPY, {label} | {rate:,.0f} | {rate / med['floor']:.2f}× |")
    return lines


async def singles(conn: asyncpg.Connection, args: argparse.Namespace) -> list[str]:
    await conn.execute("TRUNCATE pgworker.jobs CASCADE")
    q = queries("pgworker")
    raw = await conn.prepare("INSERT INTO pgworker.jobs (type, payload) VALUES ('noop', $1::jsonb)")
    statement = await conn.prepare(q._sql["job_insert"])
    times: dict[str, list[float]] = {
        "floor": [],
        "raw": [],
        "library": [],
        "python": [],
        "statement": [],
        "result": [],
    }
    for i in range(args.singles):
        for name in ("floor", "raw", "library") if i % 2 == 0 else ("library", "raw", "floor"):
            await asyncio.sleep(0.02)
            payload = json.dumps({"t": time.time()})
            if name == "floor":
                times[name].append(await _timed(conn.execute(floor.ENQUEUE_ONE, payload)))
            elif name == "raw":
                times[name].append(await _timed(raw.fetch(payload)))
            else:
                times[name].append(await _timed(pgworker.enqueue(conn, "noop", {"t": time.time()})))
        await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        spec = pgworker.JobSpec("noop", {"t": time.time()})
        fields = _fields(spec, None)
        arguments = _columns(fields, _payload(None, spec.payload))
        t1 = time.perf_counter()
        row = await statement.fetchrow(*arguments)
        t2 = time.perf_counter()
        _result(row, None)
        t3 = time.perf_counter()
        times["python"].append(t1 - t0)
        times["statement"].append(t2 - t1)
        times["result"].append(t3 - t2)
    ms = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return [
        f"one durable enqueue after 20 ms idle, medians of {args.singles}",
        "",
        "| what | ms |",
        "|---|---:|",
        f"| the floor's insert and NOTIFY (its table) | {ms['floor']:.3f} |",
        f"| raw INSERT into pgworker.jobs (its trigger notifies) | {ms['raw']:.3f} |",
        f"| pgworker.enqueue | {ms['library']:.3f} |",
        f"| pgworker.enqueue's Python before its statement | {ms['python']:.3f} |",
        f"| its statement (job_insert.sql) | {ms['statement']:.3f} |",
        f"| its result | {ms['result']:.3f} |",
    ]


async def run(args: argparse.Namespace) -> list[str]:
    server = await asyncpg.connect(args.dsn)
    await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
    await server.execute(f"CREATE DATABASE {DATABASE}")
    conn = await asyncpg.connect(args.dsn.rsplit("/", 1)[0] + "/" + DATABASE)
    try:
        await pgworker.migrate(conn)
        await conn.execute(floor.SCHEMA)
        lines = await singles(conn, args)
        return [*lines, "", *await bulk(conn, args)]
    finally:
        await conn.close()
        await server.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--singles", type=int, default=300)
    print("\n".join(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
