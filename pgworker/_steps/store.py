"""Where one worker's steps are read and written (see _steps.py): the connections they use."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from .._db.connection import Runner
from .._db.queries import queries

CLOSE_TIMEOUT = 5.0
"""Seconds a stopping worker waits for steps still holding a connection before closing it."""

IDLE_LIFETIME = 1.0
"""Seconds a transactional step's connection is kept once its step has ended, for the next one:
steps that follow each other closely reuse it, a worker whose steps stopped holds none."""


class StepStore:
    """Where one worker's steps are read and written. Their reads, records and milestones (one
    statement each) take turns on the worker's `shared` connection, as the outcomes do; a
    transactional step takes a connection of the steps' pool for its transaction only (its
    function runs there, for as long as it takes: on the shared connection it would hold up the
    outcomes and the heartbeat). That pool holds up to `size` connections (one per slot), opened
    when a transactional step needs one and closed IDLE_LIFETIME seconds after its last use."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        size: int,
        worker_id: str,
        *,
        pooler: bool = False,
        shared: Runner | None = None,
    ) -> None:
        self.q = queries(schema)
        self.pooler = pooler
        self._dsn = dsn
        # Through a transaction pooler: no startup parameter, no prepared statement kept.
        self._options: dict[str, Any] = (
            {"statement_cache_size": 0}
            if pooler
            else {"server_settings": {"application_name": f"pgworker:{worker_id}:steps"[:63]}}
        )
        self._size = size
        self._shared = shared
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    async def writes(self) -> Runner:
        """Where a step's one-statement reads and writes run: the worker's shared connection,
        else (a store of its own, outside a worker) the steps' pool."""
        if self._shared is not None:
            return self._shared
        return await self.pool()

    async def pool(self) -> asyncpg.Pool:
        """The pool a transactional step takes its connection from."""
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        self._dsn,
                        min_size=0,
                        max_size=self._size,
                        max_inactive_connection_lifetime=IDLE_LIFETIME,
                        timeout=10,
                        **self._options,
                    )
        return self._pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT)
        except Exception:  # a step of an abandoned handler still holds its connection
            pool.terminate()
        except BaseException:
            pool.terminate()
            raise
