"""A plain script, no framework (README, Frameworks, A plain script): enqueue a batch in one
transaction (a cron job, a backfill) and, with --wait, run its jobs in this process until they
are done. Exits 1 if one failed. Run it (after `pgworker migrate`):

    PGWORKER_DSN=postgresql://app@db/app python examples/script.py ada@example.org --wait
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import asyncpg

import pgworker

registry = pgworker.Registry()


@registry.task("send-newsletter")
async def send_newsletter(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    if "@" not in payload["to"]:
        raise pgworker.PermanentError(f"not an address: {payload['to']!r}")
    return {"sent_to": payload["to"]}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Send this edition of the newsletter.")
    parser.add_argument("addresses", nargs="+")
    parser.add_argument("--edition", default="2026-12")
    parser.add_argument("--wait", action="store_true", help="run the jobs here until done")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    dsn = os.environ["PGWORKER_DSN"]

    conn = await asyncpg.connect(dsn)
    try:
        specs = [
            pgworker.JobSpec(
                "send-newsletter", {"to": to}, idempotency_key=f"newsletter:{args.edition}:{to}"
            )
            for to in args.addresses
        ]
        results = await pgworker.enqueue_many(conn, specs)  # all or nothing
        for to, r in zip(args.addresses, results, strict=True):
            print(f"job {r.job.id} {to}: {'enqueued' if r.created else 'already enqueued'}")
        if not args.wait:
            return 0
        ids = [r.job.id for r in results]
        async with pgworker.Worker(registry, dsn, concurrency=4):
            async with asyncio.timeout(args.timeout):
                while True:
                    jobs = [await pgworker.get_job(conn, i) for i in ids]
                    if all(j is not None and j.status not in ("pending", "running") for j in jobs):
                        break
                    await asyncio.sleep(0.1)
        for job in jobs:
            assert job is not None
            print(f"job {job.id}: {job.status}" + (f" ({job.error})" if job.error else ""))
        return 0 if all(j is not None and j.status == "completed" for j in jobs) else 1
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
