"""The HTTP API (issue 14, item 3). Placeholder: owned by the API helper."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from .._db.connection import create_pool
from .._db.queries import queries


@contextlib.asynccontextmanager
async def resources(app: Any, config: Any) -> AsyncIterator[None]:
    """The pool and queries every route uses, for the server's lifetime."""
    pool = await create_pool(config.dsn, size=4, application_name="pgworker:serve")
    app.state.pool = pool
    app.state.queries = queries(config.schema)
    try:
        yield
    finally:
        await pool.close()


def install(app: Any, config: Any) -> None:
    """Add the API's routes to `app`."""
