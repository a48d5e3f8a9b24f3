"""The ASGI application of `pgworker serve`: FastAPI (Starlette underneath, served by uvicorn).

FastAPI is chosen over plain Starlette because the API's OpenAPI document and its request
validation come from one set of typed models, which schemathesis then checks; the dashboard uses
the same application with Jinja2 templates. Both share one asyncpg pool, opened by the lifespan."""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from .._version import __version__

if TYPE_CHECKING:
    from ..registry import Registry

BODY_LIMIT = 1024 * 1024
"""The largest request body accepted by default, in bytes."""


@dataclass(frozen=True, slots=True)
class WebConfig:
    """How `pgworker serve` runs: validated by the CLI before the server starts."""

    dsn: str
    schema: str = "pgworker"
    tokens: tuple[str, ...] = ()
    """Bearer tokens accepted; empty only with `insecure_no_auth`."""
    insecure_no_auth: bool = False
    read_only: bool = False
    body_limit: int = BODY_LIMIT
    maintenance: bool = True
    worker_id: str = ""
    """The id this server leads maintenance under."""
    registry: Registry | None = None
    """The tasks (`serve --app`): POST /jobs of one of their types gets the task's defaults and,
    for a typed task, its payload checked; the OpenAPI document lists each type's payload
    schema. Other types are enqueued as without a registry."""


def token_ok(config: WebConfig, token: str | None) -> bool:
    """Whether `token` is one of the configured tokens (always true with `insecure_no_auth`).
    Compared in constant time against every token, so that neither the match nor its position
    shows in the time taken."""
    if config.insecure_no_auth:
        return True
    if not token:
        return False
    given = token.encode("utf-8", "surrogatepass")
    found = False
    for known in config.tokens:
        found |= hmac.compare_digest(given, known.encode("utf-8", "surrogatepass"))
    return found


def create_app(config: WebConfig) -> FastAPI:
    """The application: the API under /jobs, /queues, /workers, /healthz, the dashboard at /."""
    from . import api, dashboard, schemas

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with api.resources(app, config):
            yield

    app = FastAPI(title="pgworker", version=__version__, lifespan=lifespan)
    app.state.config = config
    api.install(app, config)
    dashboard.install(app, config)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = schemas.complete(FastAPI.openapi(app), config.registry)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
