"""The dashboard and HTTP API as an ASGI application to mount in your own (the `web` extra):

    from fastapi import FastAPI
    from pgworker.web import Operator, create_app

    app = FastAPI()
    app.mount("/admin/jobs", create_app(pool, operators=[Operator("alice", TOKEN, "operate")]))

What `pgworker serve` runs is the same application (docs/operations/dashboard.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import _bulk as bulk
from . import _validate as validate
from ._web.operators import ROLES, Operator, Role, header_name, role, unique
from .errors import ConfigError, ValidationError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .registry import Registry

__all__ = ["ROLES", "Operator", "Role", "create_app"]


def create_app(
    dsn_or_pool: Any,
    *,
    operators: Iterable[Operator] = (),
    read_only: bool = False,
    schema: str = "pgworker",
    insecure_no_auth: bool = False,
    trusted_user_header: str | None = None,
    trusted_user_role: Role = "read",
    registry: Registry | None = None,
    body_limit: int = 1024 * 1024,
) -> FastAPI:
    """The dashboard (at `/` of the mount point, pages under `/ui`) and the HTTP API (`/jobs`,
    `/queues`, ...), an ASGI application for `app.mount(prefix, ...)`; every link, redirect,
    form and cookie stays under the prefix.

    `dsn_or_pool`: an asyncpg pool (used, never closed: yours), or a DSN, on which the
    application opens a pool of its own at its first request (Starlette runs no lifespan of a
    mounted application) and keeps it for the life of the process. `operators`: who may log in
    or send `Bearer TOKEN` (at least one, unless `insecure_no_auth` or `trusted_user_header`).
    `read_only`: every write refused, for every operator. `trusted_user_header`: the header a
    reverse proxy names its authenticated user in (e.g. `X-Forwarded-User`), each such user
    acting with `trusted_user_role`; only behind a proxy that removes that header from what
    clients send. Takes no part in maintenance (the workers do it), but runs the bulk actions
    it creates, and adopts those whose runner died, in a background task started at its first
    request (unless `read_only`). Invalid options raise ConfigError naming the argument."""
    from ._web.app import create_app as build
    from ._web.config import WebConfig

    found = unique(_operators(operators), "operators")
    header = None
    if trusted_user_header is not None:
        header = header_name("trusted_user_header", trusted_user_header)
    chosen = role("trusted_user_role", trusted_user_role)
    if not found and not insecure_no_auth and header is None:
        raise ConfigError(
            "operators",
            "give at least one Operator, or trusted_user_header, or insecure_no_auth=True",
        )
    if not isinstance(body_limit, int) or body_limit < 1:
        raise ConfigError("body_limit", "must be a whole number of bytes from 1")
    if not read_only:  # read by the console's runner of bulk actions, at its first request
        try:
            bulk.lease()
        except ValidationError as exc:
            raise ConfigError(exc.field, str(exc).removeprefix(f"{exc.field}: ")) from None
    if isinstance(dsn_or_pool, str):
        dsn, pool = dsn_or_pool, None
    elif hasattr(dsn_or_pool, "acquire"):
        dsn, pool = "", dsn_or_pool
    else:
        raise ConfigError("dsn_or_pool", "give a DSN (str) or an asyncpg pool")
    config = WebConfig(
        dsn=dsn,
        schema=validate.identifier("schema", schema, error=ConfigError),
        operators=found,
        insecure_no_auth=insecure_no_auth,
        read_only=read_only,
        body_limit=body_limit,
        maintenance=False,
        runner_kind="console",
        registry=registry,
        trusted_user_header=header,
        trusted_user_role=chosen,
    )
    return build(config, pool)


def _operators(given: Iterable[Operator]) -> list[Operator]:
    found = list(given)
    for op in found:
        if not isinstance(op, Operator):
            raise ConfigError("operators", "each must be a pgworker.web.Operator")
    return found
