"""Where one worker's steps are read and written (see _steps.py): the pool they run on."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from ._db.queries import queries

CLOSE_TIMEOUT = 5.0
"""Seconds a stopping worker waits for steps still holding a connection before closing it."""


class StepStore:
    """Where one worker's steps are read and written: a pool of up to `size` connections (one per
    slot), opened when a step first needs it and closed when the worker stops."""

    def __init__(
        self, dsn: str, schema: str, size: int, worker_id: str, *, pooler: bool = False
    ) -> None:
        self.q = queries(schema)
        self._dsn = dsn
        # Through a transaction pooler: no startup parameter, no prepared statement kept.
        self._options: dict[str, Any] = (
            {"statement_cache_size": 0}
            if pooler
            else {"server_settings": {"application_name": f"pgworker:{worker_id}:steps"[:63]}}
        )
        self._size = size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    async def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._opening:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(
                        self._dsn,
                        min_size=0,
                        max_size=self._size,
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
