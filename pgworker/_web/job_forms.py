"""The console's job forms: edit a pending job (run at, priority, payload) and enqueue a job,
with a form drawn from its task's payload schema when the console knows the tasks
(`serve --app`, `create_app(registry=...)`); and how many jobs a list's filter matches, for its
"select all matching" (the list's script asks).

Nothing here checks a value a second way: an edit is `update_job` (what `pgworker job update` and
PATCH /jobs/{id} run), an enqueue `routes.jobs.known_enqueue` (what POST /jobs runs), and a
typed task's payload is checked by `Registry.checked_json` for both, its error naming the field
(`payload.amount`). Both forms need the `operate` role (a `read` operator gets 403, the page
too), the session's CSRF token and this server's origin, as every form of the dashboard; each
change is recorded under the operator's name in the job's events, which the operator log shows
(an edit as `updated`, by update_job; an enqueue as `enqueued`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import _bulk as bulk
from .. import _validate as validate
from ..enqueue import update_job
from ..errors import JobNotPending, PgWorkerError, ValidationError
from ..models import PRIORITY_LABELS
from ..operations import show_job
from . import dashboard_words as words
from .dashboard import (
    PREFIX,
    SECURITY_HEADERS,
    _Dashboard,
    _filter_of,
    _job_id,
    _moment_of,
    _NotFound,
    _Refused,
)
from .routes.jobs import known_enqueue

FIELD = "f."
"""The prefix of a payload field's name in the enqueue form (`f.amount`): apart from the form's
own fields (csrf, type, queue, ...), whatever the schema names its properties."""
SCALARS = {"string": "text", "integer": "number", "number": "number", "boolean": "boolean"}
"""JSON Schema types drawn as an input of their own; any other (an object, a list, a union) is a
JSON text area."""
MAX_TYPES_SHOWN = 200


def _field(name: str, schema: Mapping[str, Any], required: bool) -> dict[str, Any]:
    """How the form draws the property `name` of a payload schema: its input `kind` (text,
    number, boolean, choice or json), its label, whether it is required, its default."""
    kind_of = schema.get("type")
    options = schema.get("anyOf")
    nullable = False
    if kind_of is None and isinstance(options, list):  # Optional[X]: X, or null
        kinds = [o for o in options if isinstance(o, Mapping) and o.get("type") != "null"]
        nullable = len(kinds) < len(options)
        if len(kinds) == 1:
            schema = {**kinds[0], **{k: v for k, v in schema.items() if k != "anyOf"}}
            kind_of = schema.get("type")
    kind = SCALARS.get(kind_of, "json") if isinstance(kind_of, str) else "json"
    if isinstance(schema.get("enum"), list) and kind == "text":
        kind = "choice"
    default = schema.get("default")
    shown = ""
    if default is not None:
        shown = json.dumps(default) if kind == "json" else str(default).lower()
        if kind in ("text", "choice", "number"):
            shown = str(default)
    return {
        "name": name,
        "input": FIELD + name,
        "kind": kind,
        "json_type": kind_of if isinstance(kind_of, str) else "JSON",
        "label": str(schema.get("title") or name),
        "description": str(schema.get("description") or ""),
        "required": required,
        "nullable": nullable,
        "choices": [str(c) for c in schema.get("enum") or []],
        "default": shown,
        "step": "1" if kind_of == "integer" else "any",
    }


def fields_of(schema: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The form's fields for a payload schema (pydantic's, an object with properties); None when
    the schema is not one a form can draw (the payload is then a JSON text area)."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, Mapping):
        return None
    required = set(schema.get("required") or ())
    return [
        _field(str(name), prop if isinstance(prop, Mapping) else {}, name in required)
        for name, prop in properties.items()
    ]


def _number(text: str) -> Any:
    """A number as typed (an int when it has no fraction), else the text itself: the payload's
    check then says what the field needs."""
    try:
        return validate.whole(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value and abs(value) != float("inf") else text


def payload_of(fields: list[dict[str, Any]], form: Mapping[str, Any]) -> dict[str, Any]:
    """The payload the generated form gives: each field read as its schema's type says (a field
    left empty is left out: the schema's default, or its `required` error). A value that is
    not of its type is passed on as typed, for the payload's check to name."""
    payload: dict[str, Any] = {}
    for f in fields:
        raw = form.get(f["input"])
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise ValidationError(f"payload.{f['name']}", "must be text")
        text = raw.strip() if f["kind"] != "text" else raw
        if text == "":
            continue
        if f["kind"] == "number":
            payload[f["name"]] = _number(text)
        elif f["kind"] == "boolean":
            payload[f["name"]] = {"true": True, "false": False}.get(text, text)
        elif f["kind"] == "json":
            payload[f["name"]] = _json(f"payload.{f['name']}", text)
        else:
            payload[f["name"]] = text
    return payload


def _json(field: str, text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValidationError(field, "nests too deep") from None
    except ValueError as exc:
        raise ValidationError(field, f"must be JSON: {exc}") from None


def _text(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError(name, "must be text")
    return value.strip()


def _priority(text: str) -> int | str | None:
    """A priority as typed: an int, or a label (enqueue and update_job check it)."""
    if not text:
        return None
    try:
        return validate.whole(text)
    except ValueError:
        return text


class JobForms:
    """The edit and enqueue forms and the count of a filter's jobs, on the dashboard's sessions
    and templates."""

    def __init__(self, board: _Dashboard) -> None:
        self.board = board

    @property
    def registry(self) -> Any:
        return self.board.config.registry

    def _operator_only(self, request: Request) -> None:
        """A form's page, like its POST, is for an operator who may change things: 405 on a
        --read-only server, 403 for a `read` operator (the POST is refused so by the
        dashboard's one role check)."""
        self.board._writable()
        found = self.board.identity(request)
        if found is not None and not found.may_operate:
            raise _Refused(
                403,
                "Not allowed",
                f"Operator {found.name} has the read role: it can look, not change anything.",
            )

    # --- the count of a filter -------------------------------------------------------------

    async def matching(self, request: Request) -> Response:
        """/ui/matching: how many jobs the list's filter matches (up to the highest id now)."""
        if self.board.identity(request) is None:
            return _json_answer({"error": "log in to the dashboard first", "field": None}, 401)
        try:
            job_filter = _filter_of(request.query_params)
        except _Refused as refused:
            return _json_answer({"error": refused.message, "field": None}, 422)
        async with self.board.database() as conn:
            max_id, matched = await bulk.count(conn, job_filter, schema=self.board.config.schema)
        return _json_answer({"matched": matched, "max_id": max_id})

    # --- edit ------------------------------------------------------------------------------

    async def _job(self, conn: Any, job_id: int) -> dict[str, Any]:
        try:
            found = await show_job(
                conn, job_id, redact_keys=self.board.redact_keys, schema=self.board.config.schema
            )
        except PgWorkerError as exc:  # a payload written around pgworker's checks
            raise _Refused(500, "This job cannot be shown", str(exc)) from None
        if found is None:
            raise _NotFound(job_id)
        return found

    def _edit_page(
        self,
        request: Request,
        session: Any,
        found: dict[str, Any],
        values: Mapping[str, str] | None = None,
        error: ValidationError | PgWorkerError | None = None,
        status: int = 200,
    ) -> Response:
        job = found["job"]
        hidden = found["payload"] != job.payload  # a sensitive key's value is not on the page
        parked = job.run_at.year == datetime.max.year
        shown = {
            "run_at": "" if parked else job.run_at.isoformat(),
            "priority": str(job.priority),
            "payload": "" if hidden else json.dumps(job.payload, indent=2, ensure_ascii=False),
            **(values or {}),
        }
        return self.board.page(
            request,
            "job_edit.html",
            {
                "title": f"Edit job {job.id}",
                "job": job,
                "pending": job.status.value == "pending",
                "parked": parked,
                "payload_hidden": hidden,
                "values": shown,
                "error": None if error is None else str(error),
                "error_field": getattr(error, "field", None),
                "typed": self._typed(job.type),
                "labels": PRIORITY_LABELS,
            },
            status=status,
            session=session,
        )

    def _typed(self, type: str) -> bool:
        registry = self.registry
        return bool(registry is not None and type in registry and registry[type].payload_type)

    async def edit_form(self, request: Request) -> Response:
        """/ui/jobs/{id}/edit: a pending job's run at, priority and payload, as they are."""
        self._operator_only(request)
        job_id = _job_id(request.path_params["job_id"])

        async def render(session: Any) -> Response:
            async with self.board.database() as conn:
                found = await self._job(conn, job_id)
                status = 200 if found["job"].status.value == "pending" else 409
                return self._edit_page(request, session, found, status=status)

        return await self.board._with_session(request, render)

    async def edit(self, request: Request) -> Response:
        """The edit form's POST: the fields changed from the job's values (run at, priority,
        payload) given to update_job, recorded under the operator's name; then the job's page.
        A bad value (a typed task's payload checked by its schema) is refused with the form
        shown again, the field named (422); a job that no longer is pending, 409."""
        board = self.board
        session, form = await board._checked_button(request)
        if session is None:
            return board._redirect(board.url(request, f"{PREFIX}/login"))
        job_id = _job_id(request.path_params["job_id"])
        values: dict[str, str] = {}
        async with board.database() as conn:
            found = await self._job(conn, job_id)
            job = found["job"]
            try:
                values = {k: _text(form, k) for k in ("run_at", "priority", "payload")}
                changes = self._changes(found, values)
                if not changes:
                    kind, text = "warn", f"Nothing changed: job {job_id} already had these values."
                else:
                    await _update(conn, job_id, changes, board.actor(request), board.config.schema)
                    said = ", ".join(changes)
                    kind, text = "ok", f"Job {job_id} was changed: {said}."
            except (ValidationError, JobNotPending) as exc:
                status = 409 if isinstance(exc, JobNotPending) else 422
                return self._edit_page(request, session, found, values, exc, status)
            response = board._redirect(board.url(request, f"{PREFIX}/jobs/{job.id}"))
            board._flash(request, response, session, kind, text)
        return response

    def _changes(self, found: dict[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
        """The fields the form changes, by update_job's names, each as it takes it."""
        job = found["job"]
        changes: dict[str, Any] = {}
        if values["run_at"] and values["run_at"] != job.run_at.isoformat():
            changes["run_at"] = _moment_of(values["run_at"])
        priority = _priority(values["priority"])
        if priority is not None and priority != job.priority:
            changes["priority"] = priority
        if values["payload"]:
            if found["payload"] != job.payload:
                raise ValidationError(
                    "payload",
                    "holds values of sensitive keys this page does not show; change it with "
                    "PATCH /jobs/{id} or pgworker job update",
                )
            payload = _json("payload", values["payload"])
            if payload != job.payload:
                registry = self.registry
                if registry is not None:
                    payload = registry.checked_json(job.type, payload)
                changes["payload"] = payload
        return changes

    # --- enqueue ---------------------------------------------------------------------------

    def _enqueue_page(
        self,
        request: Request,
        session: Any,
        type: str,
        values: Mapping[str, Any] | None = None,
        error: ValidationError | PgWorkerError | None = None,
        status: int = 200,
    ) -> Response:
        registry = self.registry
        tasks = [] if registry is None else sorted(t.name for t in registry)[:MAX_TYPES_SHOWN]
        task = registry[type] if registry is not None and type in registry else None
        schema = None
        fields = None
        if task is not None and task.payload_type is not None:
            schema = task.payload_type.json_schema()
            fields = fields_of(schema)
        return self.board.page(
            request,
            "job_enqueue.html",
            {
                "title": "Enqueue a job",
                "type": type,
                "tasks": tasks,
                "known": registry is not None,
                "task": task,
                "fields": fields,
                "schema": None if schema is None else words.pretty(schema),
                "values": dict(values or {}),
                "error": None if error is None else str(error),
                "error_field": getattr(error, "field", None),
                "labels": PRIORITY_LABELS,
            },
            status=status,
            session=session,
        )

    async def enqueue_form(self, request: Request) -> Response:
        """/ui/enqueue: the tasks the console knows (`?type=` picks one), and the chosen type's
        form: its payload's fields when its task declares a payload type, else a JSON text."""
        self._operator_only(request)
        type = request.query_params.get("type", "").strip()
        if type:
            try:
                type = validate.name("type", type, validate.MAX_TYPE_LENGTH)
            except ValidationError as exc:
                raise _Refused(400, "Bad type", str(exc)) from None

        async def render(session: Any) -> Response:
            return self._enqueue_page(request, session, type)

        return await self.board._with_session(request, render)

    async def enqueue(self, request: Request) -> Response:
        """The enqueue form's POST: the job enqueued as POST /jobs enqueues it (the task's
        defaults and payload check), recorded under the operator's name; then its page. A bad
        value is refused with the form shown again, the field named (422)."""
        board = self.board
        session, form = await board._checked_button(request)
        if session is None:
            return board._redirect(board.url(request, f"{PREFIX}/login"))
        type = ""
        values: dict[str, Any] = {}
        try:
            values = {k: _text(form, k) for k in ("type", "queue", "priority", "run_at", "payload")}
            values.update(
                {k: v for k, v in form.items() if k.startswith(FIELD) and isinstance(v, str)}
            )
            type = validate.name("type", values["type"], validate.MAX_TYPE_LENGTH)
            registry = self.registry
            task = registry[type] if registry is not None and type in registry else None
            fields = None
            if task is not None and task.payload_type is not None:
                fields = fields_of(task.payload_type.json_schema())
            if fields is not None:
                payload: Any = payload_of(fields, form)
            else:
                payload = _json("payload", values["payload"]) if values["payload"] else None
            options = {
                "queue": values["queue"] or None,
                "priority": _priority(values["priority"]),
                "run_at": _moment_of(values["run_at"]) if values["run_at"] else None,
            }
            add = known_enqueue(registry, type, payload)
            async with board.database() as conn:
                result = await add(conn, type, payload, **options, schema=board.config.schema)
                job = result.job
                detail = json.dumps({"type": job.type, "queue": job.queue})
                await board.q.job_event_record(
                    conn, job.id, "enqueued", board.actor(request), detail
                )
                response = board._redirect(board.url(request, f"{PREFIX}/jobs/{job.id}"))
                board._flash(
                    request, response, session, "ok", f"Job {job.id} was enqueued on {job.queue}."
                )
        except PgWorkerError as exc:
            if not isinstance(exc, ValidationError):
                raise
            return self._enqueue_page(request, session, type, values, exc, 422)
        return response


async def _update(conn: Any, job_id: int, changes: dict[str, Any], by: str, schema: str) -> None:
    await update_job(conn, job_id, **changes, by=by, schema=schema)


def _json_answer(body: Any, status: int = 200) -> Response:
    response = JSONResponse(body, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def install(app: Any, board: _Dashboard) -> None:
    """Add the job forms' routes (GET the form, POST it) and /ui/matching."""
    forms = JobForms(board)
    routes: list[tuple[str, Any, list[str]]] = [
        (f"{PREFIX}/matching", forms.matching, ["GET"]),
        (f"{PREFIX}/enqueue", forms.enqueue_form, ["GET"]),
        (f"{PREFIX}/enqueue", forms.enqueue, ["POST"]),
        (f"{PREFIX}/jobs/{{job_id}}/edit", forms.edit_form, ["GET"]),
        (f"{PREFIX}/jobs/{{job_id}}/edit", forms.edit, ["POST"]),
    ]
    for path, handler, methods in routes:
        app.router.add_route(path, board.guarded(handler), methods=methods)


__all__ = ["JobForms", "fields_of", "install", "payload_of"]
