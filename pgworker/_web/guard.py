"""What stands before every route: the bearer token (or a trusted proxy's user) and the role of its
operator, --read-only, the body limit, and the one
shape of every error ({"error": ..., "field": ...}), which never holds a traceback, the input
echoed at length, or a secret (_redact.scrub)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import BaseRoute, Mount, Route

from .. import _validate as validate
from .._db.connection import CONNECTION_ERRORS
from .._logs import get_logger
from .._redact import describe, scrub, summary
from ..errors import (
    ConfigError,
    DatabaseUnavailable,
    IdempotencyConflict,
    PgWorkerError,
    SchemaError,
    ValidationError,
)
from ..models import PRIORITY_LABELS
from .bounds import RETRY_AFTER, Unanswered
from .config import WebConfig, who
from .operators import SAFE_METHODS, Identity
from .schemas import NO_NUL

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN = ("/healthz", "/")
"""Paths without the bearer token: the health check, and the dashboard's (its own login)."""
DASHBOARD = "/ui"
IDENTITY = "pgworker.identity"
"""The key of the request's scope that holds who sent it (an operators.Identity), once the guard
has identified them: `identity(request)` reads it."""
DRAIN_LIMIT = 64 * 1024 * 1024
"""The most bytes of a refused body read (and dropped) so that its sender can read the 413; a
sender of more has its connection closed."""
BODY_SECONDS = 30.0
"""The longest a request's body may take to arrive, from the first read of it: a client that sends
it slower, or stops sending, is answered 408 and its connection closed (else it would hold a
connection and a task for as long as it liked, a byte at a time)."""

_log = get_logger()


def problem(status: int, error: str, field: str | None = None, **headers: str) -> JSONResponse:
    """An error answer. Its text is cut short and scrubbed of secrets (it may quote the input)."""
    body: dict[str, Any] = {"error": summary(scrub(error))}
    if field is not None:
        body["field"] = summary(scrub(field), 200)
    return JSONResponse(body, status_code=status, headers=headers or None)


def unavailable(error: str) -> JSONResponse:
    """A 503: the database did not answer (in time); the client may try again later."""
    return problem(503, error, **{"Retry-After": str(RETRY_AFTER)})


class TooSlow(HTTPException):
    """A body still incomplete BODY_SECONDS after it was first read."""

    def __init__(self) -> None:
        super().__init__(
            408,
            f"the request body did not arrive within {BODY_SECONDS:g} s; send it whole, faster",
            headers={"Connection": "close"},
        )


class TooLarge(HTTPException):
    """A body past the limit, found while reading it (no Content-Length to refuse it by)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit:,} bytes")


def route_path(scope: Scope) -> str:
    """The path within this application: without the prefix it is mounted under (root_path)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        path = path[len(root) :] or "/"
    return path


def identity(scope: Scope) -> Identity | None:
    """Who sent the request, as the guard found them (None on the dashboard's pages, which read
    their session: dashboard.py)."""
    found = scope.get(IDENTITY)
    return found if isinstance(found, Identity) else None


def actor(scope: Scope, by: str | None, default: str) -> str:
    """Who an action of the API is recorded as done by: a named operator's name, else `by` as
    the client gives it, else `default` (a shared token or --insecure-no-auth: as before named
    operators). A named operator cannot act under another name: `by` is refused (422)."""
    found = identity(scope)
    if found is None or not found.named:
        return by or default
    if by is not None and by != found.name:
        raise ValidationError(
            "by",
            f"you act as operator {found.name}: actions are recorded under that name; leave "
            "`by` out",
        )
    return found.name


def guarded(path: str) -> bool:
    """Whether `path` needs the bearer token (the dashboard checks its own session)."""
    return path not in OPEN and path != DASHBOARD and not path.startswith(DASHBOARD + "/")


def bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def methods_of(routes: Sequence[BaseRoute], path: str) -> frozenset[str] | None:
    """The methods `path` takes: those of the most literal route template that matches it
    (`/jobs/claim` rather than `/jobs/{id}`, whatever the order of the routes); None when no
    route matches it (404), or a mount does (the mount answers)."""
    best: tuple[int, str] | None = None
    methods: dict[str, set[str]] = {}
    for route in _flat(routes):
        if isinstance(route, Mount) and route.path_regex.match(path):
            return None
        if not isinstance(route, Route) or not route.path_regex.match(path):
            continue
        rank = (len(route.param_convertors), route.path)
        best = rank if best is None or rank < best else best
        methods.setdefault(route.path, set()).update(route.methods or ())
    return None if best is None else frozenset(methods[best[1]])


def _flat(routes: Sequence[BaseRoute]) -> Iterator[BaseRoute]:
    """The routes, with those of an included router in its place (FastAPI keeps an included
    router whole, as one route; pgworker includes its API router without a prefix)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _flat(included.routes)
        else:
            yield route


def allow(methods: frozenset[str]) -> str:
    return ", ".join(sorted(methods))


class Guard:
    """ASGI middleware, in this order: the token (401), a method the path does not take (405,
    with `Allow`), --read-only (405), the body limit (413, by Content-Length before reading
    anything, else while reading), and the time the body takes to arrive (408)."""

    def __init__(self, app: ASGIApp, config: WebConfig, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.config = config
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            if refusal.status_code == 413 and "connection" not in refusal.headers:
                await _drain(receive, DRAIN_LIMIT)
            return
        limit = self.config.body_limit
        seen = 0
        ended = False
        deadline: float | None = None

        async def limited() -> Message:
            nonlocal seen, ended, deadline
            if ended:  # the body is whole: what is left to receive is the client leaving
                return await receive()
            if deadline is None:
                deadline = anyio.current_time() + BODY_SECONDS
            with anyio.move_on_after(deadline - anyio.current_time()):
                message = await receive()
                seen += len(message.get("body", b""))
                ended = not message.get("more_body", False)
                if seen > limit:
                    raise TooLarge(limit)
                return message
            raise TooSlow()

        await self.app(scope, limited, send)
        if seen > limit and not ended:
            await _drain(receive, DRAIN_LIMIT)

    def _refusal(self, scope: Scope) -> JSONResponse | None:
        config = self.config
        path = route_path(scope)
        if guarded(path):
            token = bearer(scope)
            found = who(config, token, _headers(scope, config.trusted_user_header))
            if found is None:
                challenge = 'Bearer realm="pgworker"'
                if token:
                    challenge += ', error="invalid_token"'
                return JSONResponse(
                    {
                        "error": "send a token in the Authorization header as `Bearer TOKEN`, "
                        "TOKEN one of serve's --token or PGWORKER_API_TOKEN"
                        if token is None
                        else "the bearer token is not one this server accepts"
                    },
                    status_code=401,
                    headers={"WWW-Authenticate": challenge},
                )
            scope[IDENTITY] = found
        taken = methods_of(self.routes, path)
        read_only = config.read_only and guarded(path)
        here = (taken or frozenset()) & SAFE_METHODS if read_only else taken
        if taken is not None and here is not None and scope["method"] not in taken:
            return problem(
                405,
                f"this path does not take {scope['method']}; it takes {allow(taken)}",
                Allow=allow(here),
            )
        if read_only and scope["method"] not in SAFE_METHODS:
            return problem(
                405,
                "this server is read-only (pgworker serve --read-only): writes are refused",
                Allow=allow(here or frozenset()),
            )
        # The one role check of the API, by method: any route that is not GET, HEAD or OPTIONS,
        # those added later too, needs an `operate` operator.
        found = identity(scope)
        # Sent by the browser by itself (a proxy's header, no auth at all): a form of another
        # site would act as the user. Pages of that site cannot forge Origin.
        ambient = found is not None and found.ambient and scope["method"] not in SAFE_METHODS
        if ambient and cross_site(scope):
            return problem(
                403,
                "a change sent from a page of another site is refused (cross-site request); "
                "send it from this server's own pages, or with an Authorization header",
                "Origin",
            )
        if found is not None and not found.may_operate and scope["method"] not in SAFE_METHODS:
            return problem(
                403,
                f"operator {found.name} has the read role: it may look, not change anything "
                "(this needs the operate role)",
            )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = validate.whole(value.decode("latin-1"))
                except ValueError:
                    return problem(400, "Content-Length is not a number", "Content-Length")
                if length > config.body_limit:
                    return problem(
                        413,
                        f"the request body is {length:,} bytes, over the limit of "
                        f"{config.body_limit:,} (pgworker serve --body-limit)",
                        **({"Connection": "close"} if length > DRAIN_LIMIT else {}),
                    )
        return None


def _headers(scope: Scope, wanted: str | None) -> dict[str, str] | None:
    """The one header `wanted` of the request (lower-case name), when a header is trusted; none
    when the request holds it twice (a proxy that adds its own after the client's: the first
    would be the client's, anyone's)."""
    if wanted is None:
        return None
    key = wanted.encode("latin-1")
    found = [value for name, value in scope.get("headers", ()) if name == key]
    return {wanted: found[0].decode("latin-1")} if len(found) == 1 else {}


def cross_site(scope: Scope) -> bool:
    """Whether a browser says the request comes from a page of another site: its Sec-Fetch-Site,
    or an Origin that is not the host it was sent to (Host, or X-Forwarded-Host behind a
    proxy). Browsers send Origin with every cross-origin POST; a client that is not a browser
    sends neither."""
    headers = {n.decode("latin-1"): v.decode("latin-1") for n, v in scope.get("headers", ())}
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = headers.get("origin")
    if origin is None:
        return False
    hosts = {headers.get("host"), headers.get("x-forwarded-host")} - {None, ""}
    return urlsplit(origin).netloc not in hosts


async def _drain(receive: Receive, most: int) -> None:
    """Read and drop what is left of a refused body, up to `most` bytes and for BODY_SECONDS at
    most: a client still sending it then reads the 413 instead of a reset connection. Nothing of
    it is kept."""
    read = 0
    with anyio.move_on_after(BODY_SECONDS):
        while read <= most:
            message = await receive()
            if message["type"] != "http.request":
                return
            read += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _field(loc: tuple[Any, ...]) -> str:
    """The input at fault: the top-level field (a body's, a query's or a path's), else `body`."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "filter":  # a bulk action's filter: its key
        return f"filter.{parts[1]}"
    return parts[0] if parts else "body"


def _priority_problem(value: Any) -> str:
    """What is wrong with a priority, as enqueue() says it but without the value: a label sent
    by mistake may be a secret pasted in the wrong field."""
    labels = ", ".join(PRIORITY_LABELS)
    if isinstance(value, str):
        return f"priority: unknown label; use an int or one of {labels}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"priority: must be an int from {validate.MIN_INT} to {validate.MAX_INT}, or a label"
    return f"priority: must be an int or a label ({labels})"


def install(app: FastAPI, config: WebConfig) -> None:
    """The middleware and the error handlers."""
    app.add_middleware(Guard, config=config, routes=app.router.routes)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        field = _field(tuple(first.get("loc", ("body",))))
        if first.get("type") == "json_invalid":
            return problem(422, "the body is not valid JSON", "body")
        if first.get("type") == "extra_forbidden":
            return problem(422, f"{field} is not a field of this request; remove it", field)
        context: Any = first.get("ctx") or {}
        if context.get("pattern") == NO_NUL:
            return problem(422, f"{field}: must not contain NUL characters", field)
        if field == "priority":  # a union (int or label): say both, never what was sent
            return problem(422, _priority_problem(first.get("input")), field)
        # pydantic's `msg` says what is allowed; its `input` (what was sent, maybe a secret) is
        # never part of the answer.
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return problem(422, f"{field}: {message}", field)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, say)
            return problem(422, "the body is not valid JSON (UTF-8), or nests too deep", "body")
        headers = dict(exc.headers or {})
        return problem(exc.status_code, str(exc.detail), **headers)

    @app.exception_handler(PgWorkerError)
    async def refused(request: Request, exc: PgWorkerError) -> JSONResponse:
        if isinstance(exc, ValidationError | ConfigError):
            return problem(422, str(exc), exc.field)
        if isinstance(exc, IdempotencyConflict):
            return problem(409, str(exc), "idempotency_key")
        if isinstance(exc, DatabaseUnavailable | SchemaError):
            return unavailable(str(exc))
        return problem(409, str(exc))

    @app.exception_handler(Unanswered)
    async def gave_up(request: Request, exc: Unanswered) -> JSONResponse:
        _log.warning("request given up", path=request.url.path, error=str(exc))
        return unavailable(str(exc))

    @app.exception_handler(asyncpg.PostgresError)
    async def database_refused(request: Request, exc: asyncpg.PostgresError) -> JSONResponse:
        if isinstance(exc, asyncpg.DataError):
            return problem(422, f"the database refused a value: {describe(exc)}", "body")
        _log.warning("request failed in the database", path=request.url.path, error=describe(exc))
        return unavailable("the database could not answer; nothing was changed: try again")

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, exc: ClientDisconnect) -> Response:
        """The client left in the middle of its body: nobody reads an answer, and nothing is
        logged (any client, without a token, could otherwise fill the log with tracebacks)."""
        return Response(status_code=400)

    async def lost(request: Request, exc: Exception) -> JSONResponse:
        return unavailable("the database is unavailable; try again")

    # Each by its class, not under Exception: Starlette re-raises what the Exception handler
    # answers, and uvicorn then logs a traceback and closes the client's connection.
    for kind in CONNECTION_ERRORS:
        if issubclass(kind, Exception) and not issubclass(kind, asyncpg.PostgresError):
            app.add_exception_handler(kind, lost)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, CONNECTION_ERRORS):
            return unavailable("the database is unavailable; try again")
        _log.error("request failed unexpectedly", path=request.url.path, exc_info=exc)
        return problem(500, "the server failed; its log says why")
