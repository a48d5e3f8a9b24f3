"""Run the invoice example end to end: `python -m examples.invoices.run` (PGWORKER_DSN).

Creates the schema and the invoices table, requests invoices (one order twice), serves them with
an embedded worker, and prints one invoice per order."""

from __future__ import annotations

import asyncio
import os

import asyncpg

import pgworker

from . import repository, service
from .tasks import registry


async def main(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await pgworker.migrate(conn)
        await repository.create_schema(conn)
        for order, amount in [("A-1001", 1200), ("A-1002", 560), ("A-1001", 1200)]:
            async with conn.transaction():
                result = await service.request_invoice(conn, order, amount)
            print(f"order {order}: job {result.job.id} ({'new' if result.created else 'existing'})")
        async with pgworker.Worker(registry, dsn, poll_interval=0.1):
            # A script that waits for its jobs: polling the table is the simplest honest way.
            while await conn.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pgworker.jobs WHERE type = 'create-invoice' "
                "AND status IN ('pending', 'running')"
            ):
                await asyncio.sleep(0.1)
        for row in await conn.fetch(
            "SELECT order_id, count(*) FROM invoices GROUP BY 1 ORDER BY 1"
        ):
            print(f"order {row['order_id']}: {row['count']} invoice")
    finally:
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main(os.environ["PGWORKER_DSN"]))
