"""How `pgworker serve` (or a mounted dashboard) runs, and the one check of who sends a request
(a bearer token, a trusted proxy's header): what the application, the API, the dashboard and the
guard all read, so it sits below them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.convertors import CONVERTOR_TYPES, PathConvertor, register_url_convertor

from .operators import ANONYMOUS, NAME, SHARED_NAME, Identity, Operator, Role, identify, identity_of

if TYPE_CHECKING:
    from ..registry import Registry


class _TextConvertor(PathConvertor):
    """`{name:text}`: a path parameter that may hold any character, `/` (sent as %2F) and line
    breaks too (Starlette's `path` does not match a newline: a queue named "a\nb" was a 404)."""

    regex = "(?s:.*)"


if "text" not in CONVERTOR_TYPES:
    register_url_convertor("text", _TextConvertor())

BODY_LIMIT = 1024 * 1024
"""The largest request body accepted by default, in bytes."""


@dataclass(frozen=True, slots=True)
class WebConfig:
    """How `pgworker serve` runs: validated by the CLI before the server starts."""

    dsn: str
    schema: str = "pgworker"
    tokens: tuple[str, ...] = ()
    """Shared bearer tokens (--token, $PGWORKER_API_TOKEN): each an operator named `token`, role
    operate, whose actions are recorded as before (`dashboard`, or the API's `by`)."""
    operators: tuple[Operator, ...] = ()
    """Named operators (--tokens-file, $PGWORKER_TOKENS, create_app(operators=))."""
    trusted_user_header: str | None = None
    """The header (lower case) a reverse proxy names its user in; None: no header is trusted."""
    trusted_user_role: Role = "read"
    """The role of a user named by the trusted header."""
    insecure_no_auth: bool = False
    read_only: bool = False
    body_limit: int = BODY_LIMIT
    maintenance: bool = True
    worker_id: str = ""
    """The id this server leads maintenance under, and runs bulk actions under."""
    runner_kind: str = "serve"
    """What this application's bulk actions are recorded as run by: `serve` (the command), or
    `console` (create_app, mounted in an application of the user's)."""
    registry: Registry | None = None
    """The tasks (`serve --app`): POST /jobs of one of their types gets the task's defaults and,
    for a typed task, its payload checked; the OpenAPI document lists each type's payload
    schema. Other types are enqueued as without a registry."""
    pooler: bool = False
    """The DSN reaches PostgreSQL through a transaction pooler (see `create_pool`)."""


def everyone(config: WebConfig) -> tuple[Operator, ...]:
    """The named operators, then one per shared token."""
    shared = tuple(Operator(SHARED_NAME, t, "operate") for t in config.tokens)
    return config.operators + shared


def token_ok(config: WebConfig, token: str | None) -> bool:
    """Whether `token` is one an operator sends (always true with `insecure_no_auth`)."""
    return config.insecure_no_auth or identify(everyone(config), token) is not None


def who(
    config: WebConfig, token: str | None, headers: Mapping[str, str] | None = None
) -> Identity | None:
    """Who sends a request: the user a trusted proxy names (only when `trusted_user_header` is
    set: a header sent by anyone else is never read), else the operator of `token` (compared in
    constant time against every token), else everyone with `insecure_no_auth`; None: nobody."""
    if config.trusted_user_header is not None and headers is not None:
        user = headers.get(config.trusted_user_header, "").strip()
        if user and NAME.fullmatch(user):
            return Identity(user, config.trusted_user_role, ambient=True)
    found = identify(everyone(config), token)
    if found is not None:
        return identity_of(found)
    return ANONYMOUS if config.insecure_no_auth else None
