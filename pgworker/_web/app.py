"""The ASGI application of `pgworker serve`: FastAPI (Starlette underneath, served by uvicorn).

FastAPI is chosen over plain Starlette because the API's OpenAPI document and its request
validation come from one set of typed models, which schemathesis then checks; the dashboard uses
the same application with Jinja2 templates. Both share one asyncpg pool, opened by the lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from .._version import __version__
from .config import WebConfig


def create_app(config: WebConfig) -> FastAPI:
    """The application: the API under /jobs, /queues, /workers, /healthz, the dashboard at /."""
    from . import api, console, dashboard, schemas

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with api.resources(app, config):
            yield

    app = FastAPI(title="pgworker", version=__version__, lifespan=lifespan)
    app.state.config = config
    api.install(app, config)
    console.install(app, dashboard.install(app, config))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = schemas.complete(FastAPI.openapi(app), config.registry)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
