"""The floor: what one Python process on raw asyncpg can do with the same table pattern and no
library. A table with the minimal columns; `slots` concurrent loops, each on its own connection,
claim up to `batch` jobs with one UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED LIMIT n)
RETURNING, "run" them (no-op) and mark them done with one UPDATE per batch. No attempt rows, no
leases: a lower bound on the work a queue on PostgreSQL must do.

For W2, a job is inserted and announced in one statement (ENQUEUE_ONE); one more connection
LISTENs and wakes one idle slot per notification. A job whose payload carries `t` records its
wake-up latency. With --fast-claims a claim commits without waiting for its WAL flush, as
pgworker's claims do by default: the least that chain can take.

    python -m bench.floor --dsn DSN [--slots 10] [--batch 10] [--fast-claims]

Runs until SIGTERM/SIGINT; an idle slot waits for a notification, at most a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal

import asyncpg

from bench.apps.common import record_latency

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

# The same claim, committed without waiting for its WAL flush (the setting is local to it).
FAST_CLAIM = CLAIM.replace(
    "WHERE id IN",
    "WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL\n  AND id IN",
)

DONE = "UPDATE floor_jobs SET status = 'done', finished_at = now() WHERE id = ANY($1::bigint[])"

CHANNEL = "floor_jobs"
ENQUEUE_ONE = f"""
WITH job AS (INSERT INTO floor_jobs (payload) VALUES ($1::jsonb))
SELECT pg_notify('{CHANNEL}', '')
"""


async def handler(payload: str) -> None:
    if payload != "{}":
        t = json.loads(payload).get("t")
        if t is not None:
            record_latency(t)


class Idle:
    """Slots waiting for work. A notification wakes one; one that finds none waiting is kept
    for the next slot that runs dry (it may have claimed before the job was visible)."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Event] = []
        self.unserved = 0

    def wake_one(self, *_: object) -> None:
        if self.waiting:
            self.waiting.pop().set()
        else:
            self.unserved += 1


async def slot(pool: asyncpg.Pool, batch: int, stop: asyncio.Event, idle: Idle, fast: bool) -> None:
    wake = asyncio.Event()
    async with pool.acquire() as conn:
        claim = await conn.prepare(FAST_CLAIM if fast else CLAIM)
        done = await conn.prepare(DONE)
        while not stop.is_set():
            wake.clear()
            rows = await claim.fetch(batch)
            if not rows:
                if idle.unserved:
                    idle.unserved -= 1
                    continue
                idle.waiting.append(wake)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 1.0)
                if wake in idle.waiting:
                    idle.waiting.remove(wake)
                continue
            for r in rows:
                await handler(r["payload"])
            await done.fetch([r["id"] for r in rows])


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--slots", type=int, default=10)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--fast-claims", action="store_true", help="claims skip their WAL flush")
    a = p.parse_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    idle = Idle()
    listener = await asyncpg.connect(a.dsn)
    await listener.add_listener(CHANNEL, idle.wake_one)
    try:
        async with asyncpg.create_pool(a.dsn, min_size=a.slots, max_size=a.slots) as pool:
            slots = [slot(pool, a.batch, stop, idle, a.fast_claims) for _ in range(a.slots)]
            await asyncio.gather(*slots)
    finally:
        await listener.close()


if __name__ == "__main__":
    asyncio.run(main())
