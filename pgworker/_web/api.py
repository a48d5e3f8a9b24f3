"""The HTTP API (issue 14, item 3)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from .._db.connection import create_pool
from .._db.migrations import check_schema
from .._db.queries import queries

HEALTH_TIMEOUT = 5.0


@contextlib.asynccontextmanager
async def resources(app: Any, config: Any) -> AsyncIterator[None]:
    """The pool and queries every route uses, for the server's lifetime."""
    pool = await create_pool(config.dsn, size=10, application_name="pgworker:serve")
    app.state.pool = pool
    app.state.queries = queries(config.schema)
    try:
        yield
    finally:
        await pool.close()


def install(app: FastAPI, config: Any) -> None:
    """Add the API's routes to `app`."""

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        """200 when the database answers and the schema is current, else 503."""
        try:
            with anyio.fail_after(HEALTH_TIMEOUT):
                await check_schema(app.state.pool, config.schema)
        except Exception:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})
