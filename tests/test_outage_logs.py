"""A database that cannot be reached for a while, as its operator reads the worker's log: one
WARNING line when contact is lost, one line when it is back (how long, how many retries), the
services' own retries at DEBUG, no third-party traceback at WARNING; and the worker serves again
afterwards."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from structlog.testing import capture_logs

import pgworker

from .helpers import PgProxy, logged, serves_on, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

registry = pgworker.Registry()


@registry.task("plain")
async def plain(ctx: pgworker.JobContext, payload: Any) -> Any:
    return payload


class Down(PgProxy):
    """A proxy whose database can go down: `down` closes every connection and refuses new ones
    (what a client sees of a stopped PostgreSQL) until `up`."""

    refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.close()
            return
        await super()._accept(reader, writer)

    def down(self) -> None:
        self.refusing = True
        for link in self.links:
            link.close()

    def up(self) -> None:
        self.refusing = False


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def asyncpg_records() -> Iterator[list[logging.LogRecord]]:
    """What asyncpg's loggers let through (its pool's filters applied), whatever their level."""
    handler = _Records()
    logger = logging.getLogger("asyncpg")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


async def test_an_outage_logs_one_line_when_lost_and_one_when_back(dsn: str, conn: Any) -> None:
    async with Down(dsn) as proxy:
        with capture_logs() as logs, asyncpg_records() as records:
            async with pgworker.Worker(
                registry, proxy.dsn, worker_id="cut", poll_interval=0.2
            ) as worker:
                await serves_on(conn)
                proxy.down()
                went = time.monotonic()
                await wait_for(lambda: logged(logs, "database unreachable"), timeout=30)
                # Down long enough for every service to retry, the pool's floor too (after 1 s,
                # then 2 s): what used to be a WARNING line each, and asyncpg's tracebacks.
                await wait_for(
                    lambda: all(
                        worker.health()[name]["consecutive_failures"] >= 2
                        for name in ("producer", "heartbeat", "notifier", "maintenance")
                    ),
                    timeout=30,
                )
                await wait_for(lambda: worker.health()["producer"]["consecutive_failures"] >= 6)
                proxy.up()
                outage = time.monotonic() - went
                await wait_for(lambda: logged(logs, "database reachable again"), timeout=30)
                await serves_on(conn)
    [lost] = logged(logs, "database unreachable")
    [back] = logged(logs, "database reachable again")
    assert lost["log_level"] == "warning" and lost["service"] and lost["error"], lost
    assert back["log_level"] == "info", back
    retried = [e for e in logged(logs, "failed; retrying") if e.get("kind") == "connection"]
    assert back["retries"] >= 4 * 2 + 6, back
    # A service's logger first used by an earlier test of this process keeps the processors it
    # was cached with, out of capture_logs' reach: its retries are counted when captured.
    if retried:
        assert back["retries"] == len(retried), (back, len(retried))
    assert {e["log_level"] for e in retried} <= {"debug"}
    # From the first failure to the last service's success: the outage, and at most one backoff
    # (the first retry after the database is back; the others follow it at once).
    assert outage - 1 <= back["unreachable_s"] <= outage + 8, (back, outage)
    warnings = [e for e in logs if e["log_level"] in ("warning", "error", "critical")]
    assert warnings == [lost], warnings
    loud = [r for r in records if r.levelno >= logging.WARNING]
    assert loud == [], [(r.name, r.getMessage()) for r in loud]
