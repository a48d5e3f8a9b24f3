"""What every router of the API shares: the server's resources as a FastAPI dependency (`Served`,
one typed object per application, in place of variables captured by closures), the errors every
route documents, the check that a name in the URL is text, and the job reader behind every
`/jobs/{id}` route."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter, Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.datastructures import State

from ..._db.queries import Queries, Row
from ...errors import DatabaseUnavailable, ValidationError
from .. import guard
from ..bounds import bounded
from ..config import WebConfig
from ..schemas import Problem, QueueName, UrlId

Errors = dict[int | str, dict[str, Any]]

ERRORS: Errors = {
    401: {"model": Problem, "description": "no token, or a wrong one"},
    403: {
        "model": Problem,
        "description": "a change by an operator of the read role, or sent from a page of "
        "another site",
    },
    405: {
        "model": Problem,
        "description": "a method the path does not take, or a write to a "
        "--read-only server: `Allow` lists the methods it takes",
    },
    408: {"model": Problem, "description": "the body did not arrive whole within 30 s"},
    413: {"model": Problem, "description": "the body is over the limit"},
    422: {"model": Problem, "description": "bad input: `field` names it"},
    503: {
        "model": Problem,
        "description": "given up (a row locked by another session, a database that does not "
        "answer): nothing was changed, unless `error` says the commit was in flight; try again "
        "after `Retry-After` seconds",
    },
}
"""What any route of the API may answer besides its own (guard.py, bounds.py)."""
UNKNOWN: Errors = {404: {"model": Problem, "description": "no such job"}}
FENCED: Errors = {409: {"model": Problem, "description": "that attempt no longer holds the job"}}

JobId = Annotated[UrlId, Path(description="the job's id, in ASCII digits")]
QueuePath = Annotated[QueueName, Path(description="the queue's name, URL-encoded (`/` as %2F)")]


@dataclass(frozen=True, slots=True)
class Api:
    """What the routes use, one per application (`app.state.api`): its configuration, its
    queries, and its state, where the lifespan (api.resources) or the first request (api.opened)
    puts the pool, the runner of bulk actions and whether the server takes
    client_connection_check_interval."""

    config: WebConfig
    queries: Queries
    state: State

    @property
    def schema(self) -> str:
        return self.config.schema

    def pool(self) -> Any:
        """The application's pool; DatabaseUnavailable (503) when it could not be opened. Read
        when a route reaches the database, not before: a request refused for its input is
        answered 422 whether or not the database is there."""
        found = getattr(self.state, "pool", None)
        if found is None:
            raise DatabaseUnavailable("the database is unavailable; try again")
        return found

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The request's one transaction, bounded (bounds.bounded)."""
        return bounded(self.pool(), self.queries, client_check=self.state.client_check)

    @property
    def bulk_holder(self) -> Any:
        """This application's runner of bulk actions (a _bulk.Holder), which holds the actions
        its requests create from the start; None when it runs none (read-only)."""
        runner = getattr(self.state, "bulk", None)
        return None if runner is None else runner.holder

    def bulk_started(self) -> None:
        """Wake this server's runner of bulk actions (once the action committed)."""
        if self.state.bulk is not None:
            self.state.bulk.wake()


def served(request: Request) -> Api:
    """The Api of the application the request reached (a mounted one's own, not its host's)."""
    found: Api = request.app.state.api
    return found


Served = Annotated[Api, Depends(served)]


def text_names(request: Request) -> None:
    """A name in the URL (a path parameter, a query parameter) must be UTF-8 once percent-decoded:
    Starlette decodes what is not with U+FFFD in its place, so that `/queues/%FF/pause` and
    `/queues/%FE/pause` would both act on a queue named '\\ufffd'. 422 naming the parameter."""
    raw = request.scope.get("raw_path")
    if raw is not None and any("\ufffd" in str(v) for v in request.path_params.values()):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            name = next(k for k, v in request.path_params.items() if "\ufffd" in str(v))
            raise ValidationError(name, _NOT_TEXT) from None
    query: bytes = request.scope.get("query_string", b"")
    if b"%" in query or any(b > 0x7F for b in query):
        for pair in query.split(b"&"):
            key, _, value = pair.partition(b"=")
            try:
                unquote_to_bytes(key.replace(b"+", b" ")).decode("utf-8")
                unquote_to_bytes(value.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError:
                name = unquote_to_bytes(key.replace(b"+", b" ")).decode("utf-8", "replace")
                raise ValidationError(name, _NOT_TEXT) from None


_NOT_TEXT = "must be UTF-8 text once percent-decoded"

_bearer = HTTPBearer(auto_error=False)
"""Only for the document (its security scheme): the guard checks the token of every request."""


def router(*tags: str, responses: Errors | None = None) -> APIRouter:
    """A router of the API: the bearer token, the errors any route may answer, names checked."""
    return APIRouter(
        tags=list(tags),
        dependencies=[Depends(_bearer), Depends(text_names)],
        responses={**ERRORS, **(responses or {})},
    )


async def job(api: Api, conn: Any, job_id: int) -> Row:
    """Job `job_id`, or NotFound (404)."""
    row = await api.queries.job_get(conn, job_id)
    if row is None:
        raise NotFound(job_id)
    return row


class NotFound(Exception):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"there is no job {job_id}")


class Fenced(Exception):
    def __init__(self, job_id: int, attempt: int, row: Row | None) -> None:
        now = "gone" if row is None else f"{row['status']}, at attempt {row['attempts']}"
        super().__init__(
            f"attempt {attempt} no longer holds job {job_id} (it is {now}); drop this attempt's "
            "work"
        )


def handle_errors(app: FastAPI) -> None:
    """NotFound as 404 and Fenced as 409, in the one shape of every error (guard.problem)."""

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> JSONResponse:
        return guard.problem(404, str(exc))

    @app.exception_handler(Fenced)
    async def fenced(request: Request, exc: Fenced) -> JSONResponse:
        return guard.problem(409, str(exc))
