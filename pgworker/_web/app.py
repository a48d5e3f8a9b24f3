"""The ASGI application of `pgworker serve`: FastAPI (Starlette underneath, served by uvicorn).

FastAPI is chosen over plain Starlette because the API's OpenAPI document and its request
validation come from one set of typed models, which schemathesis then checks; the dashboard uses
the same application with Jinja2 templates. Both share one asyncpg pool, opened by the lifespan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI

from .._logs import get_logger
from .._redact import describe
from .._version import __version__
from .config import WebConfig


def create_app(config: WebConfig, pool: Any = None) -> FastAPI:
    """The application: the API under /jobs, /queues, /workers, /healthz, the dashboard at /.
    Its resources (the pool, maintenance) open with its lifespan; an application mounted in
    another one, whose lifespan does not run, opens them at its first request instead
    (api.opened). `pool`: an asyncpg pool to use rather than one of its own on config.dsn; it is
    never closed here."""
    from . import api, console, dashboard, job_forms, schemas

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with api.resources(app, config, pool):
            yield

    app = FastAPI(title="pgworker", version=__version__, lifespan=lifespan)
    app.state.config = config
    app.state.pool = None
    app.state.bulk = None
    app.state.client_check = False
    app.state.opening = anyio.Lock()
    api.install(app, config)
    board = dashboard.install(app, config)
    console.install(app, board)
    job_forms.install(app, board)
    app.add_middleware(_Opener, app=app, config=config, pool=pool)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = schemas.complete(FastAPI.openapi(app), config.registry)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


_log = get_logger()


class _Opener:
    """ASGI middleware, outermost: the application's resources opened before its first request
    when no lifespan opened them (api.opened)."""

    def __init__(self, inner: Any, app: FastAPI, config: WebConfig, pool: Any) -> None:
        self.inner, self.app, self.config, self.pool = inner, app, config, pool

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.app.state.pool is None:
            from . import api

            try:
                await api.opened(self.app, self.config, self.pool)
            except Exception as exc:  # tried again at the next request
                # A route that needs the database then answers 503 (api.pool); one that does
                # not (a refusal, a validation error) answers as ever.
                _log.warning("the database could not be reached", error=describe(exc))
        await self.inner(scope, receive, send)
