"""The web dashboard: server-rendered pages at / of `pgworker serve`.

Jinja2 templates (autoescaped: a payload, type or error holding markup is shown as text) and plain
HTML forms; no script, no build step. The pages read the database through `operations` and the
`dashboard_*` queries (which read the views of migration 7); the buttons call `operations.replay`
and `operations.cancel`. Each request's database work is one transaction bounded as the API's
(bounds.bounded), its page or redirect made inside it: a request given up is rolled back (a
button's change never applied later) and answered with the error page, 503 and Retry-After.

A browser logs in once with an API token (checked like a bearer token, in constant time) and gets
an HttpOnly, SameSite=Strict session cookie signed by this server (dashboard_session.py). Every
POST carries the CSRF token of its session, and a POST whose Origin is another site's is refused
as well. `--read-only` hides the buttons and refuses their POSTs (405); `--insecure-no-auth`
opens the pages without a login (the CSRF token is still checked). The pages live under /ui
(the API owns /jobs, /queues, /workers); / is the queues page. They are not in the OpenAPI
document."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import asyncpg
import jinja2
from fastapi import FastAPI
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

from .. import _bulk as bulk
from .. import _validate as validate
from .._db.queries import queries
from .._filters import FIELDS as FILTER_FIELDS
from .._filters import JobFilter
from .._logs import get_logger
from .._redact import redactor
from ..errors import DatabaseUnavailable, PgWorkerError, SchemaError, ValidationError
from ..models import JobStatus
from ..operations import (
    MAX_ACTOR_LENGTH,
    MAX_REASON_LENGTH,
    CancelResult,
    cancel,
    limit_queue,
    list_failed,
    list_periodic,
    pause_queue,
    queue_controls,
    replay_uncommitted,
    resume_queue,
    show_job,
    status,
    waiting_for,
)
from ..settings import Settings
from . import dashboard_words as words
from . import job_list, log_words
from .bounds import RETRY_AFTER, Unanswered, bounded
from .config import everyone, who
from .dashboard_session import (
    FLASH_COOKIE,
    FLASH_LIFETIME,
    SESSION_COOKIE,
    SESSION_LIFETIME,
    Session,
    Signer,
    cookie_name,
)
from .guard import route_path
from .operators import SAFE_METHODS, Identity, identify, identity_of

PREFIX = "/ui"
THEME_COOKIE = "pgworker_theme"
"""light or dark, set by the pages' theme toggle (static/theme.js) on the dashboard's path; no
cookie (or anything else): auto, the browser's prefers-color-scheme. Read here so that the page
comes drawn in its theme (no flash of the other one)."""
THEMES = ("light", "dark")
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
SHOWN_WORKERS = 500
SHOWN_OVERDUE = 100
SHOWN_FAILURES = 20
SHOWN_HISTORY = 200
SHOWN_SCHEDULES = 500
"""The most milestones, steps and timeline entries a job's page lists (the latest ones): a job
that snoozed for weeks may have thousands of attempts."""
SHOWN_GROUPS = 20
"""The most failure groups (operations.FailureGroup) the needs-attention page shows."""
GROUP_WINDOW = timedelta(days=1)
"""The failures grouped when the filter gives no finish time: those of the last day."""
BULK_VERBS = {
    "replay": ("Replay", "replayed"),
    "cancel": ("Cancel", "cancelled"),
    "delete": ("Delete", "deleted"),
    "reschedule": ("Reschedule", "rescheduled"),
}
LIVE_WITHIN = 60.0
"""A worker seen within this many seconds is live (one whose lease is not recorded)."""
WORKERS_KEPT = 24 * 3600.0
"""The workers page leaves out a worker not seen for this long (the maintenance leader forgets
it then too: _maintenance.WORKERS_FORGOTTEN_AFTER)."""
ACTOR = "dashboard"
"""Who replays, pauses, resumes and limits, as recorded in job_events and operator_log, when the
operator has no name (a shared --token, --insecure-no-auth); a named operator's name otherwise."""
OPEN_POSTS = frozenset({f"{PREFIX}/login", f"{PREFIX}/logout"})
"""The POSTs anyone may send (each checks its CSRF token): every other one changes something,
and needs an operator of the operate role."""
SHOWN_LOG = 100
"""Entries of the operator log a page shows."""

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; "
        "img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Handler = Callable[[Request], Awaitable[Response]]

_log = get_logger()


class _Refused(Exception):
    """A request the dashboard answers with an error page."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgworker._web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(
        state=words.state,
        status_words=words.STATUS_WORDS,
        outcome_words=words.OUTCOME_WORDS,
        moment=words.moment,
        ago=words.ago,
        span=words.span,
        pretty=words.pretty,
        cut=words.cut,
        max_actor=MAX_ACTOR_LENGTH,
        max_reason=MAX_REASON_LENGTH,
        limits_text=words.limits_text,
        prefix=PREFIX,
    )
    return env


def install(app: FastAPI, config: Any) -> _Dashboard:
    """Add the dashboard's pages to `app`: / and /ui/..., with their static files."""
    dashboard = _Dashboard(app, config)
    app.mount(
        f"{PREFIX}/static",
        StaticFiles(packages=[("pgworker._web", "static")]),
        name="dashboard-static",
    )
    routes: list[tuple[str, Handler, list[str]]] = [
        ("/", dashboard.queues, ["GET"]),
        (f"{PREFIX}/login", dashboard.login_form, ["GET"]),
        (f"{PREFIX}/login", dashboard.login, ["POST"]),
        (f"{PREFIX}/logout", dashboard.logout, ["POST"]),
        (f"{PREFIX}/jobs", dashboard.jobs, ["GET"]),
        (f"{PREFIX}/jobs/actions/new", dashboard.bulk_confirm, ["GET"]),
        (f"{PREFIX}/jobs/actions", dashboard.bulk_start, ["POST"]),
        (f"{PREFIX}/jobs/actions", dashboard.bulk_list, ["GET"]),
        (f"{PREFIX}/jobs/actions/{{action_id}}", dashboard.bulk_progress, ["GET"]),
        (f"{PREFIX}/jobs/{{job_id}}", dashboard.job, ["GET"]),
        (f"{PREFIX}/jobs/{{job_id}}/replay", dashboard.replay, ["POST"]),
        (f"{PREFIX}/jobs/{{job_id}}/cancel", dashboard.cancel, ["POST"]),
        (f"{PREFIX}/queues/pause", dashboard.pause, ["POST"]),
        (f"{PREFIX}/queues/resume", dashboard.resume, ["POST"]),
        (f"{PREFIX}/queues/limit", dashboard.limit, ["POST"]),
        (f"{PREFIX}/workers", dashboard.workers, ["GET"]),
        (f"{PREFIX}/periodic", dashboard.periodic, ["GET"]),
        (f"{PREFIX}/log", dashboard.log, ["GET"]),
    ]
    for path, handler, methods in routes:
        app.router.add_route(path, dashboard.guarded(handler), methods=methods)
    return dashboard


class _Dashboard:
    """The pages and buttons of one server: its signing secret, templates and redaction keys."""

    def __init__(self, app: FastAPI, config: Any) -> None:
        self.app = app
        self.config = config
        self.q = queries(config.schema)
        self.signer = Signer()
        self.templates = _environment()
        # PGWORKER_REDACT_KEYS; a placeholder DSN when the application was given a pool
        self.redact_keys = Settings.from_env(dsn=config.dsn or "postgresql://").redact_keys

    # --- plumbing ------------------------------------------------------------------------------

    def guarded(self, handler: Handler) -> Handler:
        """`handler` with the security headers on every answer, and refusals and an unreachable
        database shown as pages rather than tracebacks."""

        async def endpoint(request: Request) -> Response:
            try:
                self._refuse_readers(request)
                response = await handler(request)
            except _Refused as refused:
                response = self.page(
                    request,
                    "error.html",
                    {"title": refused.title, "message": refused.message},
                    status=refused.status,
                )
            except Unanswered as exc:
                _log.warning("request given up", path=request.url.path, error=str(exc))
                response = self.page(
                    request,
                    "error.html",
                    {
                        "title": "Request given up",
                        "message": _sentence(str(exc)),
                    },
                    status=503,
                )
                response.headers["Retry-After"] = str(RETRY_AFTER)
            except (DatabaseUnavailable, OSError, asyncpg.PostgresError, TimeoutError):
                response = self.page(
                    request,
                    "error.html",
                    {
                        "title": "Database unavailable",
                        "message": "The database did not answer. Try again in a moment.",
                    },
                    status=503,
                )
                response.headers["Retry-After"] = str(RETRY_AFTER)
            except SchemaError as exc:
                response = self.page(
                    request,
                    "error.html",
                    {"title": "Database not ready", "message": str(exc)},
                    status=503,
                )
            response.headers.update(SECURITY_HEADERS)
            return response

        return endpoint

    def identity(self, request: Request, session: Session | None = None) -> Identity | None:
        """Who uses the page: the user a trusted proxy names (when enabled), else the operator
        who logged in (its session), else everyone with --insecure-no-auth; None: not logged
        in."""
        header = self.config.trusted_user_header
        if header is not None:
            given = request.headers.getlist(header)  # twice: the first may be the client's
            found = who(self.config, None, {header: given[0] if len(given) == 1 else ""})
            if found is not None and found.named:
                return found
        session = session or self.session(request)
        if session is not None and session.authenticated:
            if session.operator is None:
                return Identity(ACTOR, "operate", named=False)
            return Identity(session.operator, "operate" if session.role == "operate" else "read")
        if self.config.insecure_no_auth:
            return Identity(ACTOR, "operate", named=False)
        return None

    def actor(self, request: Request) -> str:
        """Who a button's action is recorded as done by: the operator's name, or ACTOR."""
        found = self.identity(request)
        return found.name if found is not None and found.named else ACTOR

    def _refuse_readers(self, request: Request) -> None:
        """The one role check of the dashboard, by method: a POST (or any method but GET, HEAD
        and OPTIONS) other than logging in and out needs an operator of the operate role; a
        `read` operator gets 403, whatever the route (those added later too)."""
        if request.method in SAFE_METHODS or route_path(request.scope) in OPEN_POSTS:
            return
        found = self.identity(request)
        if found is not None and not found.may_operate:
            raise _Refused(
                403,
                "Not allowed",
                f"Operator {found.name} has the read role: it can look, not change anything.",
            )

    def root(self, request: Request) -> str:
        """The prefix this dashboard is mounted under ('' when it is the whole application)."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def url(self, request: Request, path: str) -> str:
        """A path of this application as the browser reaches it (under the mount prefix)."""
        return self.root(request) + path

    def cookie_path(self, request: Request) -> str:
        return self.root(request) or "/"

    def session_cookie(self, request: Request) -> str:
        """This console's session cookie's name (dashboard_session.cookie_name)."""
        return cookie_name(SESSION_COOKIE, request.headers.get("host", ""), self.root(request))

    def flash_cookie(self, request: Request) -> str:
        return cookie_name(FLASH_COOKIE, request.headers.get("host", ""), self.root(request))

    @property
    def pool(self) -> Any:
        """The server's pool, opened by the lifespan (api.resources) or at the first request."""
        found = self.app.state.pool
        if found is None:
            raise DatabaseUnavailable("the database is unavailable; try again")
        return found

    def database(self) -> AbstractAsyncContextManager[Any]:
        """The request's one transaction, bounded (bounds.bounded)."""
        return bounded(self.pool, self.q, client_check=self.app.state.client_check)

    def session(self, request: Request) -> Session | None:
        return self.signer.session(request.cookies.get(self.session_cookie(request)))

    def page(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        *,
        status: int = 200,
        session: Session | None = None,
    ) -> HTMLResponse:
        session = session or self.session(request)
        flash = None
        if session is not None:
            flash = self.signer.read_flash(session, request.cookies.get(self.flash_cookie(request)))
        found = self.identity(request, session)
        root = self.root(request)
        theme = request.cookies.get(THEME_COOKIE)
        theme = theme if theme in THEMES else "auto"
        html = self.templates.get_template(template).render(
            {
                "csrf": self.signer.csrf(session) if session else "",
                # a read operator sees no button, as on a --read-only server
                "read_only": self.config.read_only or (found is not None and not found.may_operate),
                "server_read_only": self.config.read_only,
                "operator": found,
                "root": root,
                "prefix": root + PREFIX,
                "home": root + "/",
                "local_path": route_path(request.scope),
                "logged_in": bool(session and session.authenticated) or bool(found and found.named),
                "auth": not self.config.insecure_no_auth,
                "flash": flash,
                "path": request.url.path,
                "theme": theme,
                "title": "",
                **context,
            }
        )
        response = HTMLResponse(html, status_code=status)
        if flash is not None:
            response.delete_cookie(self.flash_cookie(request), path=self.cookie_path(request))
        return response

    def _give_session(self, request: Request, response: Response, cookie: str) -> None:
        response.set_cookie(
            self.session_cookie(request),
            cookie,
            max_age=SESSION_LIFETIME,
            path=self.cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def _same_origin(self, request: Request) -> bool:
        """Whether a POST comes from this server's own pages, as far as the browser says:
        browsers send Origin (and Sec-Fetch-Site) with every cross-origin POST. Behind a reverse
        proxy the browser's host is the proxy's, which passes it on as Host or X-Forwarded-Host
        (headers a page of another origin cannot make a browser send)."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return False
        origin = request.headers.get("origin")
        if origin is None:
            return True
        hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}
        return urlsplit(origin).netloc in hosts - {None, ""}

    async def checked_form(self, request: Request) -> tuple[Session | None, Mapping[str, Any]]:
        """The session and form of a POST whose origin and CSRF token are right; else 403."""
        form = await request.form()
        session = self.session(request)
        if not self._same_origin(request) or not self.signer.csrf_ok(session, form.get("csrf")):
            raise _Refused(
                403,
                "Request refused",
                "This form has expired or did not come from this dashboard. Reload the page and "
                "try again.",
            )
        return session, form

    def _redirect(self, url: str) -> RedirectResponse:
        return RedirectResponse(url, status_code=303)

    def _to_login(self, request: Request) -> RedirectResponse:
        login = self.url(request, f"{PREFIX}/login")
        return self._redirect(f"{login}?{urlencode({'next': _local(request)})}")

    async def _with_session(
        self, request: Request, render: Callable[[Session], Awaitable[Response]]
    ) -> Response:
        """A page that needs a login: rendered for a logged-in session, else a redirect to the
        login form. With --insecure-no-auth, a browser without a session is given one (its
        forms need a CSRF token all the same)."""
        session = self.session(request)
        if session is not None and self.identity(request, session) is not None:
            return await render(session)
        if self.identity(request) is None:
            return self._to_login(request)
        session, cookie = self.signer.new_session(authenticated=False)
        response = await render(session)
        self._give_session(request, response, cookie)
        return response

    # --- pages -----------------------------------------------------------------------------------

    async def queues(self, request: Request) -> Response:
        async def render(session: Session) -> Response:
            async with self.database() as conn:
                found = await status(conn, schema=self.config.schema, live_within=LIVE_WITHIN)
                oldest = {r["queue"]: r["age"] for r in found["oldest_pending"]}
                queues: dict[str, dict[str, int]] = {}
                for r in found["counts"]:
                    queues.setdefault(r["queue"], dict.fromkeys(words.STATUS_WORDS, 0))[
                        r["status"]
                    ] = r["jobs"]
                controls = {
                    c.name: c for c in await queue_controls(conn, schema=self.config.schema)
                }
                for name in controls:  # a queue paused before its first job
                    queues.setdefault(name, dict.fromkeys(words.STATUS_WORDS, 0))
                failures = await list_failed(conn, limit=SHOWN_FAILURES, schema=self.config.schema)
                overdue = await self.q.dashboard_overdue(conn, SHOWN_OVERDUE)
                return self.page(
                    request,
                    "queues.html",
                    {
                        "title": "Queues",
                        "queues": sorted(queues.items()),
                        "controls": controls,
                        "oldest": oldest,
                        "totals": {
                            s: sum(c[s] for c in queues.values()) for s in words.STATUS_WORDS
                        },
                        "workers": found["workers"],
                        "unserved": found["unserved"],
                        "failures": failures,
                        "overdue": overdue,
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    async def jobs(self, request: Request) -> Response:
        async def render(session: Session) -> Response:
            job_filter = _filter_of(request.query_params)
            limit = _whole(request.query_params, "limit", PAGE_SIZE, 1, MAX_PAGE_SIZE) or PAGE_SIZE
            before = _whole(request.query_params, "before", None, 1, validate.MAX_BIGINT)
            try:
                order = job_list.order_of(request.query_params)
            except ValidationError as exc:
                raise _Refused(400, "Bad order", str(exc)) from None
            keys = redactor(tuple(self.redact_keys))
            async with self.database() as conn:
                await self.q.plan_with_values(conn)
                rows, more = await job_list.page(
                    conn, self.q, job_filter.params(), order, before, limit
                )
                paused, held = await job_list.holds(conn, self.q, rows, self.config.schema)
                groups: list[dict[str, Any]] = []
                window = None
                if job_filter.status == "failed":
                    # Needs attention: the failures grouped as people think of them (migration
                    # 30's fingerprint), over the filter's finish window (the last day when it
                    # gives none), each one click from its jobs, and from a bulk action over
                    # them: replay the group's failed jobs, cancel its jobs still waiting for a
                    # retry (the bulk confirm and progress pages, `error_group` in the filter).
                    window = job_filter
                    if job_filter.finished_after is None:
                        window = dataclasses.replace(
                            job_filter, finished_after=datetime.now(UTC) - GROUP_WINDOW
                        )
                    for g in await self.q.jobs_failure_groups(
                        conn, dataclasses.replace(window, error=None).params(), SHOWN_GROUPS
                    ):
                        groups.append(self._failure_group(request, g, window, keys))
                now = datetime.now(UTC)
                shown_rows = [
                    {
                        **r,
                        "error": None if r["error"] is None else keys.text(r["error"]),
                        "error_detail": (
                            None if r["error_detail"] is None else keys.text(r["error_detail"])
                        ),
                        "state": job_list.state(r, paused, held, now),
                    }
                    for r in map(dict, rows)
                ]
                kept = job_filter.query()
                if limit != PAGE_SIZE:
                    kept["limit"] = str(limit)
                older = None
                if more and rows:
                    start = (
                        {"before": rows[-1]["id"]}
                        if order.sort is None
                        else {**order.query(), "after": job_list.next_after(rows[-1])}
                    )
                    older = self.url(request, f"{PREFIX}/jobs?{urlencode({**kept, **start})}")
                return self.page(
                    request,
                    "jobs.html",
                    {
                        "title": "Needs attention" if job_filter.status == "failed" else "Jobs",
                        "jobs": shown_rows,
                        "filters": job_filter,
                        "filter_query": urlencode(job_filter.query()),
                        "groups": groups,
                        "group_window": window,
                        "statuses": [s.value for s in JobStatus],
                        "older": older,
                        "newest": self.url(
                            request, f"{PREFIX}/jobs?{urlencode({**kept, **order.query()})}"
                        )
                        if before or order.after
                        else None,
                        "order": order,
                        "headings": job_list.headings(kept, order),
                        "now": now,
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    def _failure_group(
        self, request: Request, g: Any, window: JobFilter, keys: Any
    ) -> dict[str, Any]:
        """A failure group as the Needs attention page shows it: its sample redacted, its
        trend as the heights of an SVG sparkline's bars (20 for its busiest hour: drawn with SVG
        attributes, which the pages' style-src policy allows, not inline styles), its list and
        its bulk actions' links."""
        group = {**window.query(), "error_group": g["fingerprint"]}
        waiting = {"status": "pending", "error_group": g["fingerprint"]}
        peak = max(g["trend"], default=0) or 1
        return {
            **g,
            "sample": keys.text(g["sample"]),
            "bars": [round(n * 20 / peak) for n in g["trend"]],
            "href": self.url(request, f"{PREFIX}/jobs?{urlencode(group)}"),
            "replay": self.url(
                request, f"{PREFIX}/jobs/actions/new?{urlencode({'kind': 'replay', **group})}"
            ),
            "cancel": self.url(
                request, f"{PREFIX}/jobs/actions/new?{urlencode({'kind': 'cancel', **waiting})}"
            ),
        }

    # --- bulk actions over the list's filter ----------------------------------------

    async def bulk_confirm(self, request: Request) -> Response:
        """The confirmation of a bulk action: what it does, to how many jobs (counted now, up
        to the highest id now: the action touches no job enqueued later), and its button."""

        async def render(session: Session) -> Response:
            self._writable()
            kind = request.query_params.get("kind", "")
            if kind not in bulk.KINDS:
                raise _Refused(400, "Bad action", f"kind: must be one of {', '.join(bulk.KINDS)}")
            job_filter = _filter_of(request.query_params)
            async with self.database() as conn:
                max_id, matched = await bulk.count(conn, job_filter, schema=self.config.schema)
                return self.page(
                    request,
                    "bulk_confirm.html",
                    {
                        "title": "Confirm",
                        "kind": kind,
                        "verb": BULK_VERBS[kind],
                        "filters": job_filter,
                        "fields": job_filter.query(),
                        "back": self.url(request, f"{PREFIX}/jobs?{urlencode(job_filter.query())}"),
                        "matched": matched,
                        "max_id": max_id,
                        "default_run_at": (datetime.now(UTC) + timedelta(hours=1))
                        .replace(microsecond=0)
                        .isoformat(),
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    async def bulk_start(self, request: Request) -> Response:
        """The confirmed bulk action's POST: created (recorded as done by the operator), run in the
        background by this server, and its progress page shown."""
        session, form = await self._checked_button(request)
        if session is None:
            return self._redirect(self.url(request, f"{PREFIX}/login"))
        kind = form.get("kind")
        try:
            for field in (*FILTER_FIELDS, "max_id", "run_at", "reason"):
                # A filter's field sent as a file would be left out, and the action widened.
                if form.get(field) is not None and not isinstance(form.get(field), str):
                    raise ValidationError(field, "must be text")
            job_filter = JobFilter.parse({k: form.get(k) for k in FILTER_FIELDS})
            max_id = _whole(form, "max_id", None, 0, validate.MAX_BIGINT)
            run_at = None
            if kind == "reschedule":
                run_at = _moment_of(form.get("run_at"))
            async with self.database() as conn:
                action = await bulk.create(
                    conn,
                    str(kind),
                    job_filter,
                    run_at=run_at,
                    by=self.actor(request),
                    reason=_form_text(form, "reason"),
                    max_id=max_id,
                    holder=None if self.app.state.bulk is None else self.app.state.bulk.holder,
                    schema=self.config.schema,
                )
                response = self._redirect(self.url(request, f"{PREFIX}/jobs/actions/{action.id}"))
        except ValidationError as exc:
            raise _Refused(400, "Bad action", str(exc)) from None
        if self.app.state.bulk is not None:
            self.app.state.bulk.wake()
        return response

    async def bulk_progress(self, request: Request) -> Response:
        """A bulk action's progress, refreshing itself while it runs."""

        async def render(session: Session) -> Response:
            action_id = _whole(request.path_params, "action_id", None, 1, validate.MAX_BIGINT)
            assert action_id is not None
            async with self.database() as conn:
                action = await bulk.get(conn, action_id, schema=self.config.schema)
                if action is None:
                    raise _Refused(404, "No such action", f"There is no bulk action {action_id}.")
                return self.page(
                    request,
                    "bulk_progress.html",
                    {
                        "title": f"Bulk action {action.id}",
                        "action": action,
                        "verb": BULK_VERBS[action.kind],
                        "back": self.url(
                            request, f"{PREFIX}/jobs?{urlencode(action.filter.query())}"
                        ),
                        "refresh": action.running,
                        "now": datetime.now(UTC),
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    async def bulk_list(self, request: Request) -> Response:
        """The bulk actions, newest first, SHOWN_LOG at a time (`status`: only those running,
        done or failed; `before`: the id below which the next page starts)."""

        async def render(session: Session) -> Response:
            shown = request.query_params.get("status", "")
            before = _whole(request.query_params, "before", None, 1, validate.MAX_BIGINT)
            try:
                async with self.database() as conn:
                    found = await bulk.recent(
                        conn,
                        state=shown or None,
                        before=before,
                        limit=SHOWN_LOG + 1,
                        schema=self.config.schema,
                    )
            except ValidationError as exc:
                raise _Refused(400, "Bad filter", str(exc)) from None
            older = None
            if len(found) > SHOWN_LOG:
                found = found[:SHOWN_LOG]
                older = "?" + urlencode(
                    {**({"status": shown} if shown else {}), "before": found[-1].id}
                )
            return self.page(
                request,
                "bulk_actions.html",
                {
                    "title": "Bulk actions",
                    "actions": found,
                    "verbs": BULK_VERBS,
                    "shown": shown,
                    "older": older,
                    "newest": before is not None,
                    "now": datetime.now(UTC),
                },
                session=session,
            )

        return await self._with_session(request, render)

    def _writable(self) -> None:
        if self.config.read_only:
            raise _Refused(
                405,
                "Read-only dashboard",
                "This server runs with --read-only: nothing can be changed from here.",
            )

    async def job(self, request: Request) -> Response:

        async def render(session: Session) -> Response:
            job_id = _job_id(request.path_params["job_id"])
            async with self.database() as conn:
                try:
                    found = await show_job(
                        conn, job_id, redact_keys=self.redact_keys, schema=self.config.schema
                    )
                except PgWorkerError as exc:  # a payload written around pgworker's checks
                    raise _Refused(500, "This job cannot be shown", str(exc)) from None
                if found is None:
                    raise _NotFound(job_id)
                job = found["job"]
                paused = next(
                    (
                        c
                        for c in await queue_controls(conn, schema=self.config.schema)
                        if c.name == job.queue and c.paused
                    ),
                    None,
                )
                row = {
                    "status": job.status.value,
                    "error": job.error,
                    "run_at": job.run_at,
                    "milestone": words.milestone_of(job.progress),
                    "parents_left": len(found["waits_for"]),
                }
                waits = found["waits"]
                if waits and waits[-1]["event_id"] is None and not waits[-1]["timed_out"]:
                    row.update(event=waits[-1]["name"], event_deadline=waits[-1]["deadline"])
                return self.page(
                    request,
                    "job.html",
                    {
                        "title": f"Job {job.id}",
                        "job": job,
                        "state": words.state(row, paused=paused is not None),
                        "payload": found["payload"],
                        "milestones": _latest(found["milestones"]),
                        "steps": _latest(found["steps"]),
                        "timeline": _latest(_timeline(found["attempts"], found["events"])),
                        "replayable": job.status.value in ("failed", "cancelled"),
                        "cancellable": job.status.value in ("pending", "running"),
                        "refresh": job.status.value in ("pending", "running"),
                        "paused": paused,
                        "waiting": waiting_for(job, found["waits"]),
                        "parents": found["parents"],
                        "waits_for": found["waits_for"],
                        "now": datetime.now(UTC),
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    async def workers(self, request: Request) -> Response:

        async def render(session: Session) -> Response:
            async with self.database() as conn:
                rows = await self.q.dashboard_workers(conn, SHOWN_WORKERS, WORKERS_KEPT)
                overdue = await self.q.dashboard_overdue(conn, SHOWN_OVERDUE)
                return self.page(
                    request,
                    "workers.html",
                    {
                        "title": "Workers",
                        "workers": rows,
                        "overdue": overdue,
                        "live_within": LIVE_WITHIN,
                        "now": datetime.now(UTC),
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    async def periodic(self, request: Request) -> Response:

        async def render(session: Session) -> Response:
            async with self.database() as conn:
                schedules = await list_periodic(conn, limit=SHOWN_SCHEDULES, schema=self.q.schema)
                return self.page(
                    request,
                    "periodic.html",
                    {"title": "Periodic", "schedules": schedules, "now": datetime.now(UTC)},
                    session=session,
                )

        return await self._with_session(request, render)

    async def log(self, request: Request) -> Response:
        """The operator log: who paused, resumed, limited, replayed or changed what, newest
        first, SHOWN_LOG at a time (`before`: the keyset cursor of the next page)."""

        async def render(session: Session) -> Response:
            before = _log_cursor(request.query_params.get("before", ""))
            async with self.database() as conn:
                rows = await self.q.dashboard_operator_log(conn, before, SHOWN_LOG + 1)
                more = len(rows) > SHOWN_LOG
                rows = rows[:SHOWN_LOG]
                older = None
                if more and rows:
                    last = rows[-1]
                    cursor = f"{last['at'].isoformat()}|{last['source']}|{last['id']}"
                    older = f"?{urlencode({'before': cursor})}"
                return self.page(
                    request,
                    "log.html",
                    {
                        "title": "Operator log",
                        "entries": [log_words.entry(dict(r)) for r in rows],
                        "older": older,
                        "newest": bool(before),
                        "now": datetime.now(UTC),
                    },
                    session=session,
                )

        return await self._with_session(request, render)

    # --- login -----------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        if self.config.insecure_no_auth:
            return self._redirect(self.url(request, "/"))
        next_page = _safe_next(request.query_params.get("next"), self.root(request))
        session = self.session(request)
        if session is not None and session.authenticated:
            return self._redirect(next_page)
        session, cookie = self.signer.new_session(authenticated=False)
        page = self.page(
            request,
            "login.html",
            {"title": "Log in", "next": next_page, "failed": False, **self._ways_in()},
            session=session,
        )
        self._give_session(request, page, cookie)
        return page

    def _ways_in(self) -> dict[str, Any]:
        """What the login page says of the trusted proxy's header (None: not enabled)."""
        return {
            "proxy_header": self.config.trusted_user_header,
            "proxy_role": self.config.trusted_user_role,
        }

    async def login(self, request: Request) -> Response:
        """The token typed once: a new, logged-in session (never the id the browser had)."""
        if self.config.insecure_no_auth:
            return self._redirect(self.url(request, "/"))
        session, form = await self.checked_form(request)
        token = form.get("token")
        next_page = _safe_next(form.get("next"), self.root(request))
        found = identify(everyone(self.config), token.strip() if isinstance(token, str) else None)
        if found is None:
            return self.page(
                request,
                "login.html",
                {"title": "Log in", "next": next_page, "failed": True, **self._ways_in()},
                status=401,
                session=session,
            )
        response = self._redirect(next_page)
        named = identity_of(found)
        _, cookie = self.signer.new_session(
            authenticated=True, operator=named.name if named.named else None, role=named.role
        )
        self._give_session(request, response, cookie)
        return response

    async def logout(self, request: Request) -> Response:
        await self.checked_form(request)
        response = self._redirect(
            self.url(request, f"{PREFIX}/login" if not self.config.insecure_no_auth else "/")
        )
        response.delete_cookie(self.session_cookie(request), path=self.cookie_path(request))
        return response

    # --- buttons ---------------------------------------------------------------------------------

    async def _button(
        self, request: Request, act: Callable[[Any, int], Awaitable[tuple[str, str]]]
    ) -> Response:
        """A job's button's POST: refused in read-only mode (405), without a login (to the login
        form), or without the right CSRF token (403); else `act` in the request's transaction,
        then back to the job's page, which shows what `act` says happened."""
        session, _ = await self._checked_button(request)
        if session is None:
            return self._redirect(self.url(request, f"{PREFIX}/login"))
        job_id = _job_id(request.path_params["job_id"])
        async with self.database() as conn:
            kind, text = await act(conn, job_id)
            response = self._redirect(self.url(request, f"{PREFIX}/jobs/{job_id}"))
            self._flash(request, response, session, kind, text)
        return response

    async def _checked_button(self, request: Request) -> tuple[Session | None, Mapping[str, Any]]:
        """A button's session (None: not logged in) and form, once its POST is allowed."""
        if self.config.read_only:
            raise _Refused(
                405,
                "Read-only dashboard",
                "This server runs with --read-only: nothing can be changed from here.",
            )
        session, form = await self.checked_form(request)
        if session is None or self.identity(request, session) is None:
            return None, form
        return session, form

    def _flash(
        self, request: Request, response: Response, session: Session, kind: str, text: str
    ) -> None:
        response.set_cookie(
            self.flash_cookie(request),
            self.signer.flash(session, kind, text),
            max_age=FLASH_LIFETIME,
            path=self.cookie_path(request),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    async def pause(self, request: Request) -> Response:
        return await self._queue_button(request, "pause")

    async def resume(self, request: Request) -> Response:
        return await self._queue_button(request, "resume")

    async def _queue_button(self, request: Request, verb: str) -> Response:
        """The pause or resume button of a queue (the form's `queue`, and its optional
        `reason`), recorded as done by ACTOR; then back to the queues page, which says what
        happened."""
        session, form = await self._checked_button(request)
        if session is None:
            return self._redirect(self.url(request, f"{PREFIX}/login"))
        try:
            queue = validate.name("queue", form.get("queue"), validate.MAX_QUEUE_LENGTH)
            reason = validate.name(
                "reason", _form_text(form, "reason"), MAX_REASON_LENGTH, required=False
            )
        except ValidationError as exc:
            raise _Refused(400, f"Bad {exc.field}", str(exc)) from None
        act = pause_queue if verb == "pause" else resume_queue
        async with self.database() as conn:
            state = await act(
                conn, queue, reason, by=self.actor(request), schema=self.config.schema
            )
            if verb == "pause":
                kind, text = (
                    ("ok", f"Queue {queue} is paused: its jobs wait until it is resumed.")
                    if state.changed
                    else ("warn", f"Queue {queue} was already paused.")
                )
            else:
                kind, text = (
                    ("ok", f"Queue {queue} is resumed: the workers take its jobs again.")
                    if state.changed
                    else ("warn", f"Queue {queue} was not paused.")
                )
            response = self._redirect(self.url(request, _back(form, queue)))
            self._flash(request, response, session, kind, text)
        return response

    async def limit(self, request: Request) -> Response:
        """A queue's limits form: `max_running` and `rate` set as the form shows them (an empty
        field: no such limit), recorded as done by ACTOR; then back to the queues page. A bad
        value is refused (400) naming the field, and nothing is written."""
        session, form = await self._checked_button(request)
        if session is None:
            return self._redirect(self.url(request, f"{PREFIX}/login"))
        try:
            queue = validate.name("queue", form.get("queue"), validate.MAX_QUEUE_LENGTH)
            most = _form_text(form, "max_running")
            rate = _form_text(form, "rate")
            max_running = None
            if most is not None:
                try:
                    max_running = validate.whole(most)
                except ValueError:
                    raise ValidationError(
                        "max_running", f"must be a whole number from 1, got {most!r}"
                    ) from None
            async with self.database() as conn:
                state = await limit_queue(
                    conn,
                    queue,
                    max_running=max_running,
                    rate=rate,
                    by=self.actor(request),
                    schema=self.config.schema,
                )
                kind, text = (
                    ("ok", f"Queue {queue} now has {words.limits_text(state)}.")
                    if state.changed
                    else ("warn", f"Queue {queue} already had these limits.")
                )
                response = self._redirect(self.url(request, _back(form, queue)))
                self._flash(request, response, session, kind, text)
        except ValidationError as exc:
            raise _Refused(400, "Bad limit", str(exc)) from None
        return response

    async def replay(self, request: Request) -> Response:
        announce: Callable[[], None] = lambda: None  # noqa: E731

        async def act(conn: Any, job_id: int) -> tuple[str, str]:
            nonlocal announce
            try:
                done, announce = await replay_uncommitted(
                    conn, [job_id], by=self.actor(request), reason=None, schema=self.config.schema
                )
            except ValidationError:
                raise _NotFound(job_id) from None
            if job_id in done.replayed:
                return "ok", f"Job {job_id} was put back in its queue: it waits for a worker."
            now = words.STATUS_WORDS.get(done.skipped.get(job_id, ""), "changed")
            return (
                "warn",
                f"Job {job_id} was not replayed: it is {now}. Only a job that needs attention "
                "or was cancelled can be replayed.",
            )

        response = await self._button(request, act)
        announce()
        return response

    async def cancel(self, request: Request) -> Response:
        async def act(conn: Any, job_id: int) -> tuple[str, str]:
            try:
                outcome = await cancel(conn, job_id, schema=self.config.schema)
            except ValidationError:
                raise _NotFound(job_id) from None
            if outcome is CancelResult.CANCELLED:
                return "ok", f"Job {job_id} was cancelled before it ran."
            if outcome is CancelResult.CANCELLING:
                return (
                    "warn",
                    f"Cancel requested: job {job_id} is running, and its worker stops it at its "
                    "next check. This page shows when it has stopped.",
                )
            previous = str(outcome).removeprefix("already ")
            return (
                "warn",
                f"Job {job_id} was not cancelled: it is already "
                f"{words.STATUS_WORDS.get(previous, previous)}.",
            )

        return await self._button(request, act)


def _form_text(form: Mapping[str, Any], field: str) -> str | None:
    """A form's text field, None when empty or left out (an empty field is no limit)."""
    value = form.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(field, "must be text")
    return value.strip() or None


def _back(form: Mapping[str, Any], queue: str) -> str:
    """Where a queue's button leads back to: its queue's page when pressed there, else /."""
    if form.get("back") == "queue":
        return f"{PREFIX}/queues/{quote(queue, safe='')}"
    return "/"


def _sentence(text: str) -> str:
    return f"{text[:1].upper()}{text[1:]}."


class _NotFound(_Refused):
    def __init__(self, job_id: object) -> None:
        super().__init__(404, "No such job", f"There is no job {job_id}.")


def _timeline(attempts: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A job's attempts and what people did to it (replays), in the order they happened."""
    items = [{**a, "kind": "attempt", "at": a["started_at"]} for a in attempts]
    items += [{**e, "event": e["kind"], "kind": "event"} for e in events]
    return sorted(items, key=lambda i: i["at"])


class Latest(list[Any]):
    """The last SHOWN_HISTORY items of a list, and how many earlier ones are left out."""

    def __init__(self, items: list[Any], left_out: int) -> None:
        super().__init__(items)
        self.left_out = left_out


def _latest(items: list[Any]) -> Latest:
    return Latest(items[-SHOWN_HISTORY:], max(len(items) - SHOWN_HISTORY, 0))


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


def _local(request: Request) -> str:
    return str(request.url.path) + _query(request)


def _safe_next(value: object, root: str = "") -> str:
    """Where to go after logging in: a path of this application only, under its mount prefix
    `root` (never `//host`, a URL, or a path of the application it is mounted in)."""
    if (
        not isinstance(value, str)
        or not value.startswith(root + "/")
        or value.startswith("//")
        or "\\" in value
        or len(value) > 2000
        or any(ord(c) < 32 for c in value)
    ):
        return root + "/"
    return value


def _log_cursor(text: str) -> tuple[datetime, str, int] | None:
    """The operator log's `before`: `<time>|<queue or job>|<id>` (what the Older link holds)."""
    if not text:
        return None
    parts = text.split("|")
    try:
        if len(parts) != 3 or parts[1] not in ("queue", "job"):
            raise ValueError(text)
        at, number = datetime.fromisoformat(parts[0]), validate.whole(parts[2])
        if at.tzinfo is None or not 1 <= number <= validate.MAX_BIGINT:
            raise ValueError(text)
        # a time past year 1 or 9999 once in UTC: asyncpg could not send it (was a 503)
        validate.moment("before", at, error=ValueError)
    except ValueError:
        raise _Refused(
            400, "Bad page", "before: not a page of the operator log; start from the newest"
        ) from None
    return at, parts[1], number


def _job_id(value: object) -> int:
    try:
        job_id = validate.whole(value)
    except ValueError:
        raise _NotFound(value) from None
    if not 1 <= job_id <= validate.MAX_BIGINT or str(job_id) != value:
        raise _NotFound(value)
    return job_id


def _whole(
    params: Mapping[str, str], field: str, default: int | None, low: int, high: int
) -> int | None:
    text = params.get(field, "").strip()
    if not text:
        return default
    try:
        number = validate.whole(text)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise _Refused(
            400, "Bad filter", f"{field}: must be a whole number from {low} to {high}, got {text!r}"
        )
    return number


def _filter_of(params: Mapping[str, str]) -> JobFilter:
    """The list's filter from the query string (a field named when wrong): the one filter of
    GET /jobs and `pgworker jobs list`."""
    values = {k: params.get(k) for k in FILTER_FIELDS}
    ticked = params.getlist("ids") if isinstance(params, QueryParams) else []
    if len(ticked) > 1:  # the list's checkboxes: one `ids` per job ticked
        values["ids"] = ",".join(ticked)
    try:
        if params.get("selection") and not (values["ids"] or "").strip():
            raise ValidationError("ids", "select at least one job: nothing was ticked")
        return JobFilter.parse(values)
    except ValidationError as exc:
        raise _Refused(400, "Bad filter", str(exc)) from None


def _moment_of(value: object) -> datetime:
    """A reschedule's time: ISO 8601 with a time zone."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError("run_at", "give the time to run at, ISO 8601 with a time zone")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValidationError(
            "run_at", f"must be an ISO 8601 time with a time zone, got {value!r}"
        ) from None
    if moment.tzinfo is None:
        raise ValidationError("run_at", f"{value!r} has no time zone; add one, e.g. +00:00")
    return validate.run_at(moment)
