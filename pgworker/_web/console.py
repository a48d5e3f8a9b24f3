"""The operator console's live parts: the charts' numbers, the counts
the pages poll, a page per queue, and the workers page's judgement of who is gone.

Live by polling, not server-sent events: every few seconds the page's script (static/console.js)
asks /ui/live for the counts and /ui/stats for the charts, and stops while the tab is hidden
(document.visibilityState). Each poll is one ordinary request, bounded like every other
(bounds.bounded: one short transaction, its statement timeout, a 503 when the database is slow),
that works through any proxy and a transaction pooler; an event stream would hold a connection
and a task per open tab for as long as it stays open, and need a fan-out of changes that
PostgreSQL does not give without LISTEN on a direct connection.

The charts read the attempts of the window (the last hour by minute, the last day by ten
minutes) along the indexes of job_attempts.started_at, and the jobs enqueued along the BRIN
index of jobs.created_at (migration 22): their cost grows with the attempts in the window, not
with the table (docs/operations/console.md gives it on a table of five million attempts)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import _validate as validate
from ..errors import ValidationError
from ..operations import queue_controls
from . import charts
from . import dashboard_words as words
from .dashboard import (
    LIVE_WITHIN,
    PREFIX,
    SECURITY_HEADERS,
    SHOWN_WORKERS,
    WORKERS_KEPT,
    _Dashboard,
    _Refused,
)

SHOWN_QUEUES = 1000
"""The most queues /ui/live reports (queue names come from whoever enqueues)."""


def queue_url(name: str) -> str:
    """The page of queue `name` (any character, `/` too, percent-encoded), under the pages'
    prefix (templates write `{{ prefix }}{{ queue_url(name) }}`: the prefix holds the mount's)."""
    return f"/queues/{quote(name, safe='')}"


def worker_state(row: Mapping[str, Any]) -> str:
    """`live`, or `gone`: not seen for longer than its lease (a minute for a worker of an earlier
    version, which did not record it)."""
    lease = row.get("lease")
    return "gone" if row["seen_ago"] > (lease if lease else LIVE_WITHIN) else "live"


class Console:
    """The console's pages and JSON answers, on the dashboard's sessions and templates."""

    def __init__(self, board: _Dashboard) -> None:
        self.board = board
        board.templates.globals.update(queue_url=queue_url, worker_state=worker_state)

    def _json(self, body: Any, status: int = 200) -> Response:
        response = JSONResponse(body, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def _allowed(self, request: Request) -> bool:
        """Whether a JSON request comes from someone the pages show themselves to: a logged-in
        session, a trusted proxy's user, anyone with --insecure-no-auth."""
        return self.board.identity(request) is not None

    async def live(self, request: Request) -> Response:
        """/ui/live: the counts the pages show, per queue and in all, for their script."""
        if not self._allowed(request):
            return self._json({"error": "log in to the dashboard first", "field": None}, 401)
        q = self.board.q
        async with self.board.database() as conn:
            # Not operations.status: its queues-no-worker-serves check costs pending jobs times
            # workers (seconds with thousands of each), and every open page polls this.
            found = {
                "counts": await q.status_counts(conn),
                "oldest_pending": await q.status_oldest_pending(conn),
                "workers": await q.status_workers(conn, LIVE_WITHIN),
            }
            queues: dict[str, dict[str, int]] = {}
            totals = dict.fromkeys(words.STATUS_WORDS, 0)
            truncated = False
            for r in found["counts"]:
                totals[r["status"]] += r["jobs"]  # every queue's, those left out below too
                if r["queue"] in queues or len(queues) < SHOWN_QUEUES:
                    queues.setdefault(r["queue"], dict.fromkeys(words.STATUS_WORDS, 0))[
                        r["status"]
                    ] = r["jobs"]
                else:
                    truncated = True
            oldest = {
                r["queue"]: words.span(r["age"])
                for r in found["oldest_pending"]
                if r["queue"] in queues
            }
            body = {
                "totals": totals,
                "queues": queues,
                "oldest": oldest,
                "workers": len(found["workers"]),
                # queues left out (past SHOWN_QUEUES): the script leaves their counts as shown
                "truncated": truncated,
            }
        return self._json(body)

    async def stats(self, request: Request) -> Response:
        """/ui/stats: the charts' numbers (as GET /stats), for the page's script."""
        if not self._allowed(request):
            return self._json({"error": "log in to the dashboard first", "field": None}, 401)
        params = request.query_params
        try:
            async with self.board.database() as conn:
                body = await charts.stats(
                    conn,
                    self.board.q,
                    params.get("window", "hour"),
                    params.get("queue") or None,
                    params.get("type") or None,
                )
        except ValidationError as exc:
            return self._json({"error": str(exc), "field": exc.field}, 422)
        return self._json(body)

    async def queue(self, request: Request) -> Response:
        """/ui/queues/{name}: one queue's counts, oldest waiting job, throughput chart, workers,
        pause and limits."""
        raw = request.path_params.get("name") or request.url.path.rsplit("/", 1)[1]
        try:
            name = validate.name("queue", raw, validate.MAX_QUEUE_LENGTH)
        except ValidationError as exc:
            raise _Refused(404, "No such queue", str(exc)) from None
        board = self.board

        async def render(session: Any) -> Response:
            async with board.database() as conn:
                # Not operations.status (its unserved check costs pending jobs times workers).
                counts = dict.fromkeys(words.STATUS_WORDS, 0)
                for r in await board.q.status_counts(conn):
                    if r["queue"] == name:
                        counts[r["status"]] = r["jobs"]
                oldest = next(
                    (
                        r["age"]
                        for r in await board.q.status_oldest_pending(conn)
                        if r["queue"] == name
                    ),
                    None,
                )
                controls = {
                    c.name: c for c in await queue_controls(conn, schema=board.config.schema)
                }
                workers = [
                    w
                    for w in await board.q.dashboard_workers(conn, SHOWN_WORKERS, WORKERS_KEPT)
                    # An HTTP claimer that names no queue claims from any.
                    if name in w["queues"] or (w["http"] and not w["queues"])
                ]
                return board.page(
                    request,
                    "queue.html",
                    {
                        "title": f"Queue {name}",
                        "name": name,
                        "counts": counts,
                        "oldest": oldest,
                        "control": controls.get(name),
                        "workers": workers,
                        "now": datetime.now(UTC),
                    },
                    session=session,
                )

        return await board._with_session(request, render)


def install(app: Any, board: _Dashboard) -> None:
    """Add the console's routes: the queue pages and the JSON the pages' script polls."""
    console = Console(board)
    routes = [
        (f"{PREFIX}/live", console.live),
        (f"{PREFIX}/stats", console.stats),
        # A queue named pause, resume or limit has its page at the path of that button's POST:
        # the route is the same path, with GET.
        *((f"{PREFIX}/queues/{verb}", console.queue) for verb in ("pause", "resume", "limit")),
        (f"{PREFIX}/queues/{{name:text}}", console.queue),
    ]
    for path, handler in routes:
        app.router.add_route(path, board.guarded(handler), methods=["GET"])
