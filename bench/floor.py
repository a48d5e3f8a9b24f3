"""The floor: what one Python process on raw asyncpg can do with the same table pattern and no
library. A table with the minimal columns; `slots` concurrent loops, each on its own connection,
claim up to `batch` jobs with one UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT n)
RETURNING, "run" them (no-op) and mark them done with one UPDATE per batch. No attempt rows, no
notifications, no leases: a lower bound on the work a queue on PostgreSQL must do.

    python -m bench.floor --dsn DSN [--slots 10] [--batch 10]

Runs until SIGTERM/SIGINT, polling every 10 ms while the table is empty.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

import asyncpg

SCHEMA = """
CREATE TABLE floor_jobs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload     jsonb       NOT NULL DEFAULT '{}',
    status      text        NOT NULL DEFAULT 'pending',
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX floor_jobs_pending_idx ON floor_jobs (id) WHERE status = 'pending';
"""

CLAIM = """
UPDATE floor_jobs SET status = 'running', started_at = now()
WHERE id IN (
    SELECT id FROM floor_jobs WHERE status = 'pending' ORDER BY id
    LIMIT $1 FOR UPDATE SKIP LOCKED
)
RETURNING id, payload
"""

DONE = "UPDATE floor_jobs SET status = 'done', finished_at = now() WHERE id = ANY($1::bigint[])"


async def handler(payload: str) -> None:
    return None


async def slot(pool: asyncpg.Pool, batch: int, stop: asyncio.Event) -> None:
    async with pool.acquire() as conn:
        claim = await conn.prepare(CLAIM)
        done = await conn.prepare(DONE)
        while not stop.is_set():
            rows = await claim.fetch(batch)
            if not rows:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.01)
                continue
            for r in rows:
                await handler(r["payload"])
            await done.fetch([r["id"] for r in rows])


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--slots", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    a = p.parse_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with asyncpg.create_pool(a.dsn, min_size=a.slots, max_size=a.slots) as pool:
        await asyncio.gather(*(slot(pool, a.batch, stop) for _ in range(a.slots)))


if __name__ == "__main__":
    asyncio.run(main())
