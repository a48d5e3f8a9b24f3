"""Maintenance, run by one worker at a time: the holder of an advisory lock on a dedicated
connection. It rescues jobs whose lease expired and forgets workers long gone.

The connection sets `idle_session_timeout` to the lease, so a leader that freezes (SIGSTOP, a
stalled VM) loses its session, and with it the lock, within a lease; another worker then leads.
"""

from __future__ import annotations

import random

import anyio
import asyncpg

from . import db
from .logs import get_logger
from .settings import Settings

WORKERS_FORGOTTEN_AFTER = 24 * 3600.0


def interval(lease: float) -> float:
    """Expired leases are looked for every half lease, at most every 5 s."""
    return min(lease / 2, 5.0)


class Maintenance:
    def __init__(self, settings: Settings) -> None:
        self._s = settings
        self._log = get_logger(worker_id=settings.worker_id)
        self.leading = False
        self.rescued = 0

    async def _connect(self) -> asyncpg.Connection:
        s = self._s
        conn = await db.connect(
            s.dsn, server_settings={"application_name": f"pgworker-maintenance:{s.worker_id}"}
        )
        await db.end_session_when_idle(conn, s.schema, s.lease)
        return conn

    async def run(self) -> None:
        s = self._s
        failures = 0
        while True:
            conn = None
            try:
                conn = await self._connect()
                failures = 0
                ticks = 0
                while True:
                    if not self.leading:
                        self.leading = await db.try_lead(conn, s.schema)
                        if self.leading:
                            self._log.info("maintenance: this worker leads")
                    if self.leading:
                        await self._tick(conn, ticks)
                        ticks += 1
                    await anyio.sleep(interval(s.lease))
            except (*db.CONNECTION_ERRORS, db.DatabaseUnavailable) as exc:
                if self.leading:
                    self._log.warning(
                        "maintenance: leadership lost with the connection", error=str(exc)
                    )
                self.leading = False
                failures += 1
                await anyio.sleep(min(0.2 * 2**failures, 5.0) * random.uniform(0.5, 1.5))
            finally:
                if conn is not None:
                    conn.terminate()

    async def _tick(self, conn: asyncpg.Connection, ticks: int) -> None:
        for row in await db.rescue(conn, self._s.schema):
            self.rescued += 1
            self._log.warning(
                "job rescued: its worker stopped renewing the lease",
                job_id=row["id"],
                status=row["status"],
                lost_worker=row["worker_id"],
            )
        if ticks % 60 == 0:
            await db.prune_workers(conn, self._s.schema, WORKERS_FORGOTTEN_AFTER)
