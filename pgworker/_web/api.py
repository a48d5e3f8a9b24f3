"""The HTTP API (issue 14, item 3): jobs enqueued, claimed and finished by workers in any
language, and read by operators. Each route validates with pgworker's own validators, runs the
statements of sql/queries through `Queries`, and answers with jobs keyed by their column names
(JSON-safe: times in ISO 8601, payload and result as JSON).

Every route's database work is one transaction, bounded (bounds.py), and its answer is rendered
(with the stdlib json, never re-serialised by FastAPI) inside that transaction, before the write
it reports commits: an answer that cannot be produced rolls the write back, and a write that
committed is never answered 500. One nesting limit holds for all the API reads and writes,
enqueue's (validate.MAX_DEPTH): deeper JSON is refused on the way in (422) and shown null, with
`unreadable`, on the way out.

HTTP claims are durable (synchronous_commit on), so the attempt number alone, with the worker's
id, fences a heartbeat, a completion or a failure: once another attempt holds the job (the lease
expired and the job was rescued and claimed again), the old one's writes get 409."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import anyio
from annotated_types import Interval
from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer

from .. import _bulk as bulk
from .. import _validate as validate
from .._db.connection import create_pool
from .._db.migrations import check_schema
from .._db.queries import Row, queries
from .._events import emit
from .._filters import JobFilter
from .._logs import get_logger
from .._maintenance.maintenance import Maintenance
from .._redact import detail, redactor, summary
from .._runtime.service import Health, supervise
from .._waits import close as close_waiters
from .._waits import wait as wait_for_end
from ..enqueue import SELF_PARENT, UNKNOWN_PARENT, enqueue, update_job
from ..errors import DatabaseUnavailable, PgWorkerError, ValidationError
from ..models import (
    DEFAULT_MAX_RETRIES,
    JOB_FIELDS,
    JSON_COLUMNS,
    AttemptResult,
    EnqueueResult,
    Job,
    JobStatus,
    Outcome,
)
from ..operations import (
    FINISHED,
    UNCHANGED,
    QueueState,
    cancel,
    limit_queue,
    list_periodic,
    pause_queue,
    queue_controls,
    replay_uncommitted,
    resume_queue,
)
from ..retry import RetryPolicy, next_retry, why_final
from ..settings import Settings
from ..worker import LOCK_TIMEOUT
from . import charts, guard
from .bounds import Unanswered, bounded, client_check
from .charts import StatsAnswer, StatsWindow
from .config import WebConfig
from .schemas import (
    BulkBody,
    ClaimBody,
    CompleteBody,
    Correlation,
    Decimal,
    EnqueueBody,
    ErrorText,
    EventName,
    FailBody,
    HeartbeatBody,
    Problem,
    QueueControlBody,
    QueueLimitBody,
    QueueName,
    ReplayBody,
    RescheduleBody,
    RunAt,
    TypeName,
    UpdateBody,
    UrlId,
    WaitSeconds,
)

HEALTH_TIMEOUT = 5.0
POOL_SIZE = 10
DEFAULT_LEASE = 30.0
"""Seconds an HTTP claim (or heartbeat) holds its job when the request gives no lease."""
PAGE_LIMIT = 1000
"""The most jobs GET /jobs returns at once."""
POISON_SKIPS = 100
"""The most jobs with an unreadable payload one claim fails (each for good) before its 204."""
PAGE_BYTES = 8 * 1024 * 1024
"""About the most JSON (payloads, results, milestones) one page of GET /jobs holds: past it, the
page ends early with a `next_before` (a page holds at least one job, whatever its size)."""

_log = get_logger()

JobId = Annotated[UrlId, Path(description="the job's id, in ASCII digits")]
QueuePath = Annotated[QueueName, Path(description="the queue's name, URL-encoded (`/` as %2F)")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no token, or a wrong one"},
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
_UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"model": Problem, "description": "no such job"}}
_FENCED: dict[int | str, dict[str, Any]] = {
    409: {"model": Problem, "description": "that attempt no longer holds the job"}
}


@contextlib.asynccontextmanager
async def resources(app: Any, config: WebConfig, given: Any = None) -> AsyncIterator[None]:
    """The pool and queries every route uses, and the maintenance service (unless
    --no-maintenance), for the server's lifetime.

    Maintenance waits on a lock as the worker's does: at most a third of the lease, 5 s at most
    (lock_timeout on the pool's sessions, set when they connect, as the worker's pool sets it
    and plan_cache_mode), then retries and says so in the log; a request sets its own, shorter
    or not, with SET LOCAL (bounds.py). A startup parameter rather than SET LOCAL because
    maintenance sends its statements on the pool outside any transaction of its own: SET LOCAL
    would cost it a transaction and a round trip per statement. Through a transaction pooler
    (`--pooler`), which refuses startup parameters, that is what it costs."""
    settings = maintenance_settings(config) if config.maintenance else None
    pool = given or await create_pool(
        config.dsn,
        size=POOL_SIZE,
        application_name="pgworker:serve",
        lock_timeout=None if settings is None else min(settings.lease / 3, LOCK_TIMEOUT),
        pooler=config.pooler,
    )
    app.state.bulk = None
    maintenance: Maintenance | None = None
    try:
        await _ready(app, config, pool)
        async with anyio.create_task_group() as tg:
            if not config.read_only:
                # Bulk actions run here, in the background: those created by this server's
                # requests at once, those left running (a server killed) from start-up.
                app.state.bulk = bulk.Runner(pool, config.schema)
                tg.start_soon(app.state.bulk.serve)
            if settings is not None:
                maintenance = Maintenance(pool, settings)
                log = get_logger(worker_id=settings.worker_id)
                tg.start_soon(supervise, maintenance, Health(), log)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            if maintenance is not None:
                with contextlib.suppress(Exception):
                    await maintenance.resign()
            await close_waiters()
            app.state.pool = None
            if given is None:
                await pool.close()


async def _ready(app: Any, config: WebConfig, pool: Any) -> None:
    """What every route reads from app.state: the pool (set last: its presence says the rest is
    there), the queries, and whether the server takes client_connection_check_interval."""
    q = queries(config.schema)
    app.state.queries = q
    app.state.client_check = await client_check(pool, q)
    app.state.pool = pool


async def opened(app: Any, config: WebConfig, given: Any = None) -> None:
    """The resources of an application whose lifespan did not run (mounted in another one:
    Starlette runs no lifespan of a mounted application), opened at its first request, once:
    the pool `given` (the caller's, never closed here), or one of its own on the DSN, which then
    stays open as long as the process (pass a pool to close it yourself). No maintenance: the
    workers (`pgworker run`) or `pgworker serve` do it."""
    if getattr(app.state, "pool", None) is not None:
        return
    async with app.state.opening:
        if getattr(app.state, "pool", None) is not None:
            return
        pool = given or await create_pool(
            config.dsn, size=POOL_SIZE, application_name="pgworker:web", pooler=config.pooler
        )
        try:
            await _ready(app, config, pool)
        except BaseException:
            if given is None:
                with anyio.CancelScope(shield=True):
                    await pool.close()
            raise


def opened_pool(app: Any) -> Any:
    """The application's pool; DatabaseUnavailable (503) when it could not be opened."""
    found = app.state.pool
    if found is None:
        raise DatabaseUnavailable("the database is unavailable; try again")
    return found


def maintenance_settings(config: WebConfig) -> Settings:
    """The settings maintenance runs under: PGWORKER_* (lease, retention) as for `run`."""
    return Settings.from_env(
        dsn=config.dsn, schema=config.schema, worker_id=config.worker_id or None
    )


def plain(value: Any) -> Any:
    """A value as JSON can carry it: times in ISO 8601, durations in seconds."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def job_json(row: Row | Job, **extra: Any) -> dict[str, Any]:
    """A job keyed by the `jobs` column names (models.JOB_FIELDS), JSON-safe. A JSON column
    Python cannot decode (nested too deep: written around pgworker's checks) is null, and
    `unreadable` says which and why: one such job hides neither itself nor a page of others."""
    if isinstance(row, Job):
        values = {name: getattr(row, name) for name in JOB_FIELDS}
        unreadable: dict[str, str] = {}
    else:
        values, unreadable = _columns(row)
    found = {
        name: value if name in JSON_COLUMNS else plain(value) for name, value in values.items()
    }
    found["status"] = JobStatus(values["status"]).value
    return {**found, **extra, **({"unreadable": unreadable} if unreadable else {})}


def _columns(row: Row) -> tuple[dict[str, Any], dict[str, str]]:
    """A row's columns, its JSON ones decoded, and those that cannot be, with why."""
    values: dict[str, Any] = {}
    unreadable: dict[str, str] = {}
    for name in JOB_FIELDS:
        values[name] = row[name]
        if name in JSON_COLUMNS:
            values[name], why = _decoded(row[name])
            if why is not None:
                unreadable[name] = f"the {name} of job {row['id']} cannot be decoded ({why})"
    return values, unreadable


def _decoded(text: str | None) -> tuple[Any, str | None]:
    """JSON text decoded (None, and why, when it nests deeper than enqueue accepts, or Python
    cannot decode it at all: written around pgworker's checks)."""
    if text is None:
        return None, None
    try:
        value = json.loads(text)
    except (RecursionError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {summary(str(exc), 200)}"
    deep = len(text) > validate.MAX_DEPTH and text.count("[") + text.count("{") > validate.MAX_DEPTH
    if deep and validate.too_deep(value):
        return None, f"it nests lists and objects more than {validate.MAX_DEPTH} deep"
    return value, None


class _Rendered(JSONResponse):
    """JSON rendered by the stdlib encoder when made (so inside the request's transaction), as
    plain() would: times in ISO 8601, durations in seconds."""

    def render(self, content: Any) -> bytes:
        return json.dumps(
            content, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_time_json
        ).encode("utf-8")


def _time_json(value: Any) -> Any:
    if isinstance(value, datetime | timedelta):
        return plain(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _answer(
    content: Any, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The answer, rendered now: any value within validate.MAX_DEPTH fits the stdlib encoder."""
    return _Rendered(content, status_code=status_code, headers=headers)


def _with_json(rows: list[Row], column: str) -> list[dict[str, Any]]:
    """Rows (attempts, milestones, steps) JSON-safe, their JSON `column` decoded as job_json
    does (null, with `unreadable`, when it cannot be)."""
    found = []
    for r in rows:
        item = {k: plain(v) for k, v in r.items() if k != column}
        item[column], why = _decoded(r[column])
        if why is not None:
            item["unreadable"] = {column: why}
        found.append(item)
    return found


def _names(field: str, values: list[str] | None, max_length: int) -> list[str] | None:
    if values is None:
        return None
    if not values:
        raise ValidationError(field, "must list at least one name; leave it out for any")
    return [str(validate.name(field, v, max_length)) for v in values]


def _result_text(value: Any) -> str:
    """A completion's result as jsonb text, or ValidationError naming `result`."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise ValidationError(
            "result", f"must not nest lists and objects more than {validate.MAX_DEPTH} deep"
        ) from None
    except ValueError as exc:
        raise ValidationError("result", f"cannot be stored as JSON: {exc}") from None
    problem = validate.json_problem(text, value)
    if problem is not None:
        raise ValidationError("result", problem)
    return text


def _error_parts(text: str, payload: Any) -> tuple[str, str, str | None]:
    """An HTTP worker's error as stored: `Type: message` when it reads so (else the type is
    `Error`), redacted as a handler's, and the whole text as the detail when it has more lines."""
    clean = validate.clean_text(text)
    first, _, rest = clean.partition("\n")
    kind, sep, message = first.partition(": ")
    if not sep or not kind.replace(".", "").replace("_", "").isalnum() or len(kind) > 200:
        kind, message = "Error", first
    keys = redactor()
    stored = summary(keys.text(summary(message, 64 * 1024), payload))
    full = detail(validate.clean_text(keys.text(clean[: 64 * 1024], payload))) if rest else None
    return kind, stored, full


def install(app: FastAPI, config: WebConfig) -> None:
    """Add the API's routes, its middleware and its error handlers to `app`."""
    guard.install(app, config)

    @app.get("/healthz", tags=["health"], responses={503: {"model": Problem}})
    async def healthz() -> JSONResponse:
        """200 when the database answers and the schema is current, else 503. No token."""
        try:
            async with bounded(
                pool(), q, HEALTH_TIMEOUT, client_check=app.state.client_check
            ) as conn:
                await check_schema(conn, config.schema)
        except Exception as exc:
            return guard.problem(503, f"unhealthy: {type(exc).__name__}: {exc}")
        return JSONResponse({"status": "ok"})

    api = APIRouter(dependencies=[Depends(HTTPBearer(auto_error=False))], responses=_ERRORS)
    q = queries(config.schema)
    Json = dict[str, Any]  # what the document says a route answers (rendered by _answer)

    def pool() -> Any:
        return opened_pool(app)

    def database() -> contextlib.AbstractAsyncContextManager[Any]:
        """The request's one transaction, bounded (bounds.bounded)."""
        return bounded(pool(), q, client_check=app.state.client_check)

    async def held(conn: Any, job_id: int, body: Any, request: Request) -> Row:
        """The job, while the attempt `body` names (worker_id, attempt) holds it; else 404/409."""
        worker_id = validate.name("worker_id", body.worker_id, validate.MAX_WORKER_ID_LENGTH)
        validate.count("attempt", body.attempt, minimum=1)
        row = await q.job_get(conn, job_id)
        if row is None:
            raise _NotFound(job_id)
        await q.http_worker_seen(conn, worker_id, _host(request))
        if (row["status"], row["attempts"], row["worker_id"]) != (
            "running",
            body.attempt,
            worker_id,
        ):
            raise _Fenced(job_id, body.attempt, row)
        return row

    def bulk_started() -> None:
        """Wake this server's runner of bulk actions (once the action committed)."""
        if app.state.bulk is not None:
            app.state.bulk.wake()

    async def start_bulk(
        kind: str, body: BulkBody, request: Request, run_at: Any = None
    ) -> Response:
        try:
            job_filter = JobFilter.checked(**body.filter.model_dump(exclude_none=True))
        except ValidationError as exc:
            reason = str(exc).removeprefix(f"{exc.field}: ")
            raise ValidationError(f"filter.{exc.field}", reason) from None
        async with database() as conn:
            action = await bulk.create(
                conn,
                kind,
                job_filter,
                run_at=None if run_at is None else validate.run_at(run_at),
                by=guard.actor(request.scope, body.by, "api"),
                reason=body.reason,
                schema=config.schema,
            )
            answer = _answer(action.as_json(), status_code=202)
        bulk_started()
        return answer

    @api.post("/jobs/actions/replay", status_code=202, response_model=Json, tags=["bulk"])
    async def bulk_replay(body: BulkBody, request: Request) -> Response:
        """Replay every failed or cancelled job matching `filter` (whose keys are GET /jobs's
        query parameters), in batches in the background; each replay recorded in the job's
        events (actor `by`). The jobs enqueued after this request stay out."""
        return await start_bulk("replay", body, request)

    @api.post("/jobs/actions/cancel", status_code=202, response_model=Json, tags=["bulk"])
    async def bulk_cancel(body: BulkBody, request: Request) -> Response:
        """Cancel every pending job matching `filter`, and ask the workers of the running ones
        to stop them, in batches in the background; each recorded in the job's events."""
        return await start_bulk("cancel", body, request)

    @api.post("/jobs/actions/delete", status_code=202, response_model=Json, tags=["bulk"])
    async def bulk_delete(body: BulkBody, request: Request) -> Response:
        """Delete every finished (completed, failed, cancelled) job matching `filter`, with its
        attempts and history, in batches in the background; the ids deleted are recorded in
        the operator log. Pending and running jobs are left alone."""
        return await start_bulk("delete", body, request)

    @api.post("/jobs/actions/reschedule", status_code=202, response_model=Json, tags=["bulk"])
    async def bulk_reschedule(body: RescheduleBody, request: Request) -> Response:
        """Set `run_at` of every pending job matching `filter` (not those parked waiting for an
        event), in batches in the background; each recorded in the job's events."""
        return await start_bulk("reschedule", body, request, body.run_at)

    @api.get(
        "/jobs/actions/{id}",
        response_model=Json,
        tags=["bulk"],
        responses={404: {"model": Problem, "description": "no such action"}},
    )
    async def bulk_progress(id: Annotated[UrlId, Path(description="the action's id")]) -> Response:
        """A bulk action's progress: `status` (running, done, failed), `matched` (when it was
        created), `done` (jobs changed), `skipped` (left as they were: their status no longer
        fitted when their batch came), `error` (why it failed)."""
        async with database() as conn:
            action = await bulk.get(conn, id, schema=config.schema)
            if action is None:
                return guard.problem(404, f"there is no bulk action {id}")
            return _answer(action.as_json())

    @api.post(
        "/jobs",
        status_code=201,
        response_model=Json,
        tags=["jobs"],
        responses={
            200: {"description": "the existing job of that idempotency key or unique key"},
            404: {"model": Problem, "description": "a job of `after` does not exist"},
            409: {"model": Problem},
        },
    )
    async def create_job(body: EnqueueBody) -> Response:
        """Enqueue a job: 201 with it, 200 with the existing one when its idempotency key holds
        the same type and payload (409 when it holds another, or is a job of `after`), or when
        a live job holds its unique key (with `replace`, that pending job changed; 409 while it
        runs); 404 when a job of `after` does not exist."""
        if body.run_at is not None and body.delay is not None:
            raise ValidationError("run_at", "give run_at or delay, not both")
        add: Callable[..., Awaitable[EnqueueResult]] = enqueue
        if config.registry is not None and body.type in config.registry:
            add = config.registry.enqueue  # the task's defaults, its payload checked
            typed = config.registry[body.type].payload_type
            if typed is not None:  # as the document says: JSON Schema's reading, strictly
                typed.check_json(body.payload, "payload")
        async with database() as conn:
            try:
                result = await add(
                    conn,
                    body.type,
                    body.payload,
                    queue=body.queue,
                    priority=body.priority,
                    max_retries=body.max_retries,
                    idempotency_key=body.idempotency_key,
                    correlation_id=body.correlation_id,
                    run_at=validate.moment("run_at", body.run_at)
                    if body.run_at is not None
                    else None,
                    delay=body.delay,
                    version=body.version,
                    concurrency_key=body.concurrency_key,
                    after=body.after,
                    on_parent_failure=body.on_parent_failure,
                    unique_key=body.unique_key,
                    unique_states=body.unique_states,
                    unique_period=body.unique_period,
                    replace=bool(body.replace),
                    schema=config.schema,
                )
            except ValidationError as exc:
                if exc.field == "after" and UNKNOWN_PARENT in str(exc):
                    return guard.problem(404, str(exc), "after")
                if exc.field == "after" and SELF_PARENT in str(exc):
                    return guard.problem(409, str(exc), "after")
                raise
            return _answer(job_json(result.job), 201 if result.created else 200)

    @api.post(
        "/jobs/claim",
        tags=["workers"],
        responses={204: {"description": "nothing is due"}},
    )
    async def claim(body: ClaimBody, request: Request) -> Response:
        """Claim the next due job: 200 with it and its `attempt`, 204 when nothing is due."""
        worker_id = str(validate.name("worker_id", body.worker_id, validate.MAX_WORKER_ID_LENGTH))
        types = _names("types", body.types, validate.MAX_TYPE_LENGTH)
        queues = _names("queues", body.queues, validate.MAX_QUEUE_LENGTH)
        lease = validate.seconds(
            "lease",
            DEFAULT_LEASE if body.lease is None else body.lease,
            maximum=validate.MAX_LEASE,
            zero=False,
        )
        versions: dict[str, list[int]] = {}
        for type_, allowed in (body.versions or {}).items():
            validate.name("versions", type_, validate.MAX_TYPE_LENGTH)
            if not allowed:
                raise ValidationError("versions", "must list at least one version per type")
            versions[type_] = [validate.count("versions", v, minimum=1) for v in allowed]
        async with database() as conn:
            await q.http_worker_seen(conn, worker_id, _host(request), queues, types, lease)
            for _ in range(POISON_SKIPS):
                row = await q.http_job_claim(
                    conn,
                    worker_id,
                    queues=queues,
                    types=types,
                    versions=versions,
                    lease=lease,
                    default_max_retries=DEFAULT_MAX_RETRIES,
                )
                if row is None:
                    break
                _, why = _decoded(row["payload"])
                if why is None:
                    return _answer(job_json(row, attempt=row["attempts"]))
                # As a Python worker does: a payload no worker can read fails at once.
                unreadable = AttemptResult(
                    row["id"],
                    row["attempts"],
                    row["claimed_at"],
                    JobStatus.FAILED,
                    Outcome.FAILED,
                    error_type="InvalidPayload",
                    error_message=f"the payload cannot be decoded ({why})",
                )
                await q.job_finish_many(conn, [unreadable])
        return Response(status_code=204)

    @api.post(
        "/jobs/{id}/heartbeat",
        response_model=Json,
        tags=["workers"],
        responses={**_UNKNOWN, **_FENCED},
    )
    async def heartbeat(id: JobId, body: HeartbeatBody, request: Request) -> Response:
        """Extend the attempt's lease (by `lease` seconds, default 30): 200 with the job and
        `cancel_requested` (an operator asked to stop it), 409 when the attempt no longer holds
        the job, 503 when its row is locked by another session (the lease was not extended)."""
        lease = validate.seconds(
            "lease",
            DEFAULT_LEASE if body.lease is None else body.lease,
            maximum=validate.MAX_LEASE,
            zero=False,
        )
        async with database() as conn:
            row = await held(conn, id, body, request)
            attempt = (id, body.attempt, row["claimed_at"])
            beat = (await q.worker_heartbeat(conn, [attempt], lease)).get((id, body.attempt))
            if beat is None:
                raise _Fenced(id, body.attempt, await q.job_get(conn, id))
            if not beat.extended:  # rolled back and answered 503, as a lock waited on too long
                raise Unanswered(
                    f"job {id}'s row is locked by another session: its lease was not extended "
                    "and nothing was changed; send the heartbeat again"
                )
            job = await _job(conn, id)
            return _answer(job_json(job, cancel_requested=beat.cancel_requested))

    @api.post(
        "/jobs/{id}/complete",
        response_model=Json,
        tags=["workers"],
        responses={**_UNKNOWN, **_FENCED},
    )
    async def complete(id: JobId, body: CompleteBody, request: Request) -> Response:
        """The attempt succeeded: 200 with the job, completed (also when an operator asked to
        cancel it meanwhile, as for a Python handler that returns first: a heartbeat's
        `cancel_requested` is the time to stop; `fail` then ends it cancelled)."""
        text = _result_text(body.result) if "result" in body.model_fields_set else None
        async with database() as conn:
            row = await held(conn, id, body, request)
            done = AttemptResult(
                id,
                body.attempt,
                row["claimed_at"],
                JobStatus.COMPLETED,
                Outcome.COMPLETED,
                text,
                run_ms=_since(row["claimed_at"]),
            )
            return await _finish(conn, done)

    @api.post(
        "/jobs/{id}/fail",
        response_model=Json,
        tags=["workers"],
        responses={**_UNKNOWN, **_FENCED},
    )
    async def fail(id: JobId, body: FailBody, request: Request) -> Response:
        """The attempt failed: 200 with the job, pending again with `retry_count + 1` while its
        retries remain (after RetryPolicy()'s backoff, or `retry_after` seconds), else failed;
        failed at once when `permanent`. A job an operator asked to cancel ends cancelled
        either way (never retried, nor replayed with the failed ones)."""
        after = (
            None if body.retry_after is None else validate.seconds("retry_after", body.retry_after)
        )
        async with database() as conn:
            row = await held(conn, id, body, request)
            job, _ = _columns(row)  # a column that cannot be decoded does not stop the failure
            kind, message, full = _error_parts(body.error, job["payload"])
            policy = RetryPolicy()
            delay = None
            if not body.permanent:
                delay = next_retry(policy, job["retry_count"], job["max_retries"], after)
            if delay is None and not body.permanent:
                why = why_final(policy, job["retry_count"], job["max_retries"])
                message = message[: 500 - len(why)] + why
            ends = (
                (JobStatus.FAILED, Outcome.FAILED, 0.0, 0)
                if delay is None
                else (JobStatus.PENDING, Outcome.RETRIED, delay, 1)
            )
            status, outcome, wait, retried = ends
            written = AttemptResult(
                id,
                body.attempt,
                row["claimed_at"],
                status,
                outcome,
                error_type=kind,
                error_message=message,
                delay=wait,
                retried=retried,
                error_detail=full,
                run_ms=_since(row["claimed_at"]),
            )
            return await _finish(conn, written)

    async def _finish(conn: Any, result: AttemptResult) -> Response:
        written = await q.job_finish_many(conn, [result])
        if result.job_id not in written:
            raise _Fenced(result.job_id, result.attempt, await q.job_get(conn, result.job_id))
        return _answer(job_json(await _job(conn, result.job_id)))

    async def _job(conn: Any, job_id: int) -> Row:
        row = await q.job_get(conn, job_id)
        if row is None:
            raise _NotFound(job_id)
        return row

    async def ended(job_id: int, seconds: float, request: Request) -> str:
        """Wait up to `seconds` for the job's end through the process's one waiter (_waits.py),
        holding no connection of the pool: "ended", "timeout", or "gone" (the client left).
        Whether it ended is then said from the job as read, which may have ended since."""
        outcome = "timeout"
        async with anyio.create_task_group() as tg:

            async def end() -> None:
                nonlocal outcome
                try:
                    await wait_for_end(pool(), job_id, seconds, schema=config.schema)
                    outcome = "ended"
                except TimeoutError:
                    pass
                except ValidationError as exc:
                    if exc.field != "job_id":
                        raise
                    outcome = "unknown"
                except PgWorkerError:
                    outcome = "ended"  # deleted while awaited: the read that follows says 404
                tg.cancel_scope.cancel()

            async def left() -> None:
                nonlocal outcome
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                outcome = "gone"
                tg.cancel_scope.cancel()

            tg.start_soon(end)
            tg.start_soon(left)
        if outcome == "unknown":
            raise _NotFound(job_id)
        return outcome

    @api.get("/jobs/{id}", response_model=Json, tags=["jobs"], responses=_UNKNOWN)
    async def get_job(
        id: JobId,
        request: Request,
        wait: Annotated[
            WaitSeconds | None,
            Query(
                description="long poll: wait up to this many seconds (more than 0, at most 60) "
                "for the job to end; the header `Pgworker-Wait` says `ended` or `timeout`"
            ),
        ] = None,
    ) -> Response:
        """The job, with its `attempt_history`, `milestones` and `steps`. With `wait`, answered
        when the job ends (completed, failed or cancelled) or when `wait` seconds ran out,
        whichever comes first, with the job as it is then: its `status` says whether it ended,
        and so does the header `Pgworker-Wait` (`ended` or `timeout`)."""
        waited = None if wait is None else await ended(id, wait, request)
        if waited == "gone":
            return Response(status_code=499)  # nobody reads it: the client left
        async with database() as conn:
            row = await _job(conn, id)
            attempts = [plain(dict(r)) for r in await q.job_attempts_of(conn, id)]
            return _answer(
                job_json(
                    row,
                    attempt_history=attempts,
                    milestones=_with_json(await q.job_milestones_of(conn, id), "detail"),
                    steps=_with_json(await q.job_steps_of(conn, id), "result"),
                ),
                headers=None if waited is None else {"Pgworker-Wait": _wait_word(row)},
            )

    @api.get("/jobs", response_model=Json, tags=["jobs"])
    async def list_jobs(
        status: Annotated[JobStatus | None, Query()] = None,
        type: Annotated[
            TypeName | None, Query(description="the types starting with this text")
        ] = None,
        queue: Annotated[QueueName | None, Query()] = None,
        error: Annotated[
            ErrorText | None, Query(description="the jobs whose last error holds this text")
        ] = None,
        created_after: Annotated[RunAt | None, Query(description="created at or after")] = None,
        created_before: Annotated[RunAt | None, Query(description="created before")] = None,
        finished_after: Annotated[RunAt | None, Query(description="finished at or after")] = None,
        finished_before: Annotated[RunAt | None, Query(description="finished before")] = None,
        correlation_id: Annotated[Correlation | None, Query()] = None,
        id: Annotated[UrlId | None, Query(description="the job of this id")] = None,
        payload: Annotated[
            str | None,
            # Left out of the document: JSON text in a query parameter, which a schema of a
            # string cannot describe (every string is not JSON); said in the description.
            Query(include_in_schema=False),
        ] = None,
        limit: Annotated[int, Interval(ge=1, le=PAGE_LIMIT), Decimal, Query()] = 100,
        before: Annotated[UrlId | None, Query()] = None,
    ) -> Response:
        """Jobs matching the filter, newest first: `jobs`, and `next_before`, the `before` of the
        next page (null on the last one). Every filter is optional; `type` matches the types
        that start with it, `error` the jobs whose last error holds the text (any case),
        `payload` those whose payload contains the JSON object. A page of large jobs ends
        before `limit`, at about 8 MB of JSON. `payload` (not listed below: JSON text, which no
        string schema describes) takes a JSON object, URL-encoded (`payload={"customer_id":42}`):
        the jobs whose payload contains it; 422 naming `payload` when it is not one."""
        job_filter = JobFilter.checked(
            status=None if status is None else status.value,
            type=type,
            queue=queue,
            error=error,
            created_after=created_after,
            created_before=created_before,
            finished_after=finished_after,
            finished_before=finished_before,
            correlation_id=correlation_id,
            id=id,
            payload=payload,
        )
        async with database() as conn:
            await q.plan_with_values(conn)
            rows, more = await q.http_jobs_list(
                conn, job_filter.params(), before=before, limit=limit, budget=PAGE_BYTES
            )
            jobs = [job_json(r) for r in rows]
            return _answer({"jobs": jobs, "next_before": jobs[-1]["id"] if more and jobs else None})

    @api.patch(
        "/jobs/{id}",
        response_model=Json,
        tags=["jobs"],
        responses={**_UNKNOWN, 409: {"model": Problem, "description": "the job is not pending"}},
    )
    async def update_pending_job(id: JobId, body: UpdateBody, request: Request) -> Response:
        """Change a pending job's `run_at`, `priority` or `payload` (at least one): 200 with the
        job, 409 once it runs or ended (nothing changed), 422 for a bad value or a run_at for a
        parked job."""
        async with database() as conn:
            await _job(conn, id)
            job = await update_job(
                conn,
                id,
                run_at=validate.moment("run_at", body.run_at) if body.run_at is not None else None,
                priority=body.priority,
                payload=body.payload,
                by=guard.actor(request.scope, None, "api"),
                schema=config.schema,
            )
            return _answer(job_json(await _job(conn, job.id)))

    @api.post("/jobs/{id}/cancel", response_model=Json, tags=["jobs"], responses=_UNKNOWN)
    async def cancel_job(id: JobId) -> Response:
        """Cancel a pending job, or ask the worker of a running one to stop it (its heartbeat
        says `cancel_requested`); a finished job is left as it is. 200 with the job and `cancel`:
        cancelled, cancelling or already <status>."""
        async with database() as conn:
            await _job(conn, id)
            outcome = await cancel(conn, id, schema=config.schema)
            return _answer(job_json(await _job(conn, id), cancel=outcome.value))

    @api.post(
        "/jobs/{id}/replay",
        response_model=Json,
        tags=["jobs"],
        responses={**_UNKNOWN, 409: {"model": Problem}},
    )
    async def replay_job(id: JobId, request: Request, body: ReplayBody | None = None) -> Response:
        """Run a failed or cancelled job again: pending now, its retries afresh; 409 for a job
        in another status."""
        body = body or ReplayBody.model_validate({})
        by = guard.actor(request.scope, body.by, "api")
        async with database() as conn:
            row = await _job(conn, id)
            done, announce = await replay_uncommitted(
                conn, [id], by=by, reason=body.reason, schema=config.schema
            )
            if id in done.held:
                return guard.problem(
                    409,
                    f"job {id} is {row['status']}: its unique key is held by live job "
                    f"{done.held[id]}; left as it is",
                )
            if done.skipped:
                return guard.problem(
                    409,
                    f"job {id} is {row['status']}: only failed or cancelled jobs are replayed",
                )
            answer = _answer(job_json(await _job(conn, id)))
        announce()
        return answer

    # `{name:text}`: an event's name may hold any character, a `/` (sent as %2F) too.
    @api.post("/events/{name:text}", response_model=Json, tags=["events"])
    async def emit_event(
        name: Annotated[EventName, Path(description="the event's name, URL-encoded")],
        data: Annotated[Any, Body(description="the event's data: any JSON (none: null)")] = None,
    ) -> Response:
        """Emit an event (pgworker.emit): every job waiting for it in `ctx.wait_for_event` gets
        the body as its data and runs again at once, and the event is kept for the waits that
        come later (docs/guide/events.md). 200 with `name` and `woken`, how many waiting jobs
        it woke, answered before the emit commits."""
        async with database() as conn:
            woken = await emit(conn, name, data, schema=config.schema)
            return _answer({"name": name, "woken": woken})

    @api.get("/queues", response_model=Json, tags=["operators"])
    async def list_queues() -> Response:
        """Per queue (each that a job names or that has controls): the jobs by status, the age in
        seconds of the oldest due pending job (null when none is due), whether it is `paused`
        (`paused_at`, `paused_by`, `pause_reason`: null when not) and its `limits` (an object
        with `max_running` and `rate`, each only when set: empty when it has no limit)."""
        found: dict[str, dict[str, Any]] = {}
        async with database() as conn:
            for r in await q.status_counts(conn):
                entry = found.setdefault(r["queue"], _queue_entry(r["queue"]))
                entry["counts"][r["status"]] = r["jobs"]
            for r in await q.status_oldest_pending(conn):
                entry = found.setdefault(r["queue"], _queue_entry(r["queue"]))
                entry["oldest_pending_s"] = r["age"]
            for state in await queue_controls(conn, schema=config.schema):
                entry = found.setdefault(state.name, _queue_entry(state.name))
                entry.update(_control_json(state))
            return _answer({"queues": [found[name] for name in sorted(found)]})

    # `{queue:text}`: a queue's name may hold any character, a `/` (sent as %2F) too.
    @api.post("/queues/{queue:text}/pause", response_model=Json, tags=["operators"])
    async def pause(
        queue: QueuePath, request: Request, body: QueueControlBody | None = None
    ) -> Response:
        """Pause the queue on every worker: no claim that starts once this commits takes its
        jobs; running ones finish, new ones wait as pending. Recorded in the operator log. 200
        with the queue's state and `changed` (false: it was paused already, left as it was,
        nothing logged) and `known` (false: no pending job, worker or earlier control named it;
        it is created, paused before its first job)."""
        body = body or QueueControlBody.model_validate({})
        async with database() as conn:
            state = await pause_queue(
                conn,
                queue,
                body.reason,
                by=guard.actor(request.scope, body.by, "api"),
                schema=config.schema,
            )
            return _answer(_change_json(state))

    @api.post("/queues/{queue:text}/resume", response_model=Json, tags=["operators"])
    async def resume(
        queue: QueuePath, request: Request, body: QueueControlBody | None = None
    ) -> Response:
        """Resume the queue: its workers are woken when this commits and claim its backlog at
        once. Recorded in the operator log. 200 with the queue's state, `changed` (false: it was
        not paused; nothing logged) and `known`."""
        body = body or QueueControlBody.model_validate({})
        async with database() as conn:
            state = await resume_queue(
                conn,
                queue,
                body.reason,
                by=guard.actor(request.scope, body.by, "api"),
                schema=config.schema,
            )
            return _answer(_change_json(state))

    @api.post("/queues/{queue:text}/limit", response_model=Json, tags=["operators"])
    async def limit(queue: QueuePath, body: QueueLimitBody, request: Request) -> Response:
        """Limit the queue on every worker: `max_running`, the most of its jobs running at once,
        and `rate`, the most starts per period (`600/m`); a key left out leaves that limit as it
        is, null clears it. Its workers are woken when this commits. Recorded in the operator
        log. 200 with the queue's state, `changed` (false: the limits already were so; nothing
        logged) and `known` (false: nothing named the queue; it is created, limited before its
        first job). 422 naming `max_running` or `rate` for a bad value: nothing is written."""
        given = body.model_fields_set
        if not given & {"max_running", "rate"}:
            raise ValidationError(
                "body", "give max_running or rate (null clears it), or both; got neither"
            )
        async with database() as conn:
            state = await limit_queue(
                conn,
                queue,
                max_running=body.max_running if "max_running" in given else UNCHANGED,
                rate=body.rate if "rate" in given else UNCHANGED,
                reason=body.reason,
                by=guard.actor(request.scope, body.by, "api"),
                schema=config.schema,
            )
            return _answer(_change_json(state))

    @api.get("/workers", response_model=Json, tags=["operators"])
    async def list_workers() -> Response:
        """The workers known (Python and HTTP ones), with the ids of the jobs each runs."""
        async with database() as conn:
            return _answer({"workers": [plain(dict(r)) for r in await q.http_workers(conn)]})

    @api.get("/stats", response_model=StatsAnswer, tags=["operators"])
    async def get_stats(
        window: Annotated[StatsWindow, Query()] = StatsWindow.HOUR,
        queue: Annotated[QueueName | None, Query()] = None,
        type: Annotated[TypeName | None, Query()] = None,
    ) -> Response:
        """The dashboard's charts: per minute of the last hour (`window=hour`) or per ten minutes
        of the last day (`day`), the jobs enqueued, the attempts completed and failed (by their
        start), and the p50 and p95 of the attempts' wait (claim - run_at) and run time, in
        seconds (null when nothing was measured), of one queue and one type when given. One
        array per series, aligned with `at` (each bucket's start, seconds since the epoch);
        `sampled`: 1 (every attempt); `unread_minutes`: minutes of the window neither rolled up
        nor read (0: every minute counted). Percentiles within 9.1% (docs/operations/console.md)."""
        async with database() as conn:
            return _answer(await charts.stats(conn, q, window.value, queue, type))

    @api.get("/periodic", response_model=Json, tags=["operators"])
    async def list_schedules() -> Response:
        """The periodic schedules the database records, by name (at most 1,000): each one's
        task, `schedule` (when it runs), `last_slot` enqueued and its job (`last_job_id`,
        `last_job_status`), `next_slot`, and `checked_at` (when a worker defining it last
        looked)."""
        async with database() as conn:
            found = await list_periodic(conn, schema=q.schema)
            return _answer(
                {
                    "schedules": [
                        plain(
                            {
                                "name": s.name,
                                "task": s.task,
                                "schedule": s.schedule,
                                "last_slot": s.last_slot,
                                "next_slot": s.next_slot,
                                "last_job_id": s.last_job_id,
                                "last_job_status": s.last_job_status,
                                "checked_at": s.checked_at,
                            }
                        )
                        for s in found
                    ]
                }
            )

    app.include_router(api)

    @app.exception_handler(_NotFound)
    async def not_found(request: Request, exc: _NotFound) -> JSONResponse:
        return guard.problem(404, str(exc))

    @app.exception_handler(_Fenced)
    async def fenced(request: Request, exc: _Fenced) -> JSONResponse:
        return guard.problem(409, str(exc))


def _wait_word(row: Row) -> str:
    """`Pgworker-Wait`: "ended" when the job answered has ended, else "timeout"."""
    return "ended" if row["status"] in FINISHED else "timeout"


def _queue_entry(name: str) -> dict[str, Any]:
    return {
        "queue": name,
        "counts": {s.value: 0 for s in JobStatus},
        "oldest_pending_s": None,
        **_control_json(QueueState(name)),
    }


def _control_json(state: QueueState) -> dict[str, Any]:
    """A queue's controls: whether it is paused, when, by whom, why; its limits."""
    found = state.as_json()
    return {k: found[k] for k in ("paused", "paused_at", "paused_by", "pause_reason", "limits")}


def _change_json(state: QueueState) -> dict[str, Any]:
    """What pause, resume and limit answer: the queue's controls, `changed` and `known`."""
    return {
        "queue": state.name,
        **_control_json(state),
        "changed": state.changed,
        "known": state.known,
    }


def _since(claimed_at: datetime) -> float:
    """An HTTP worker's run time, in ms: from its claim to its report (its handler's own time is
    not known here)."""
    return round(max((datetime.now(UTC) - claimed_at).total_seconds(), 0.0) * 1000, 1)


def _host(request: Request) -> str:
    return f"http:{request.client.host}" if request.client else "http"


class _NotFound(Exception):
    def __init__(self, job_id: int) -> None:
        super().__init__(f"there is no job {job_id}")


class _Fenced(Exception):
    def __init__(self, job_id: int, attempt: int, row: Row | None) -> None:
        now = "gone" if row is None else f"{row['status']}, at attempt {row['attempts']}"
        super().__init__(
            f"attempt {attempt} no longer holds job {job_id} (it is {now}); drop this attempt's "
            "work"
        )
