"""How `pgworker serve` runs, and the one check of a bearer token: what the application, the API,
the dashboard and the guard all read, so it sits below them."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.convertors import CONVERTOR_TYPES, PathConvertor, register_url_convertor

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
    pooler: bool = False
    """The DSN reaches PostgreSQL through a transaction pooler (see `create_pool`)."""


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
