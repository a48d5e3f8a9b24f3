"""The jobs: enqueued (POST /jobs), read one (GET /jobs/{id}, a long poll with `wait`) or by a
filter (GET /jobs), changed while pending (PATCH), cancelled and replayed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
from annotated_types import Interval
from fastapi import Query, Request, Response

from ... import _validate as validate
from ..._db.queries import Row
from ..._filters import JobFilter
from ..._waits import wait as wait_for_end
from ...enqueue import SELF_PARENT, UNKNOWN_PARENT, enqueue, update_job
from ...errors import PgWorkerError, ValidationError
from ...models import ENQUEUE_OPTIONS, EnqueueResult, JobStatus
from ...operations import FINISHED, cancel, replay_uncommitted
from ...registry import Registry
from .. import guard
from ..answers import (
    CancelledJob,
    JobAnswer,
    JobDetail,
    JobPage,
    answer,
    job_json,
    plain,
    with_json,
)
from ..schemas import (
    Correlation,
    Decimal,
    EnqueueBody,
    ErrorGroup,
    ErrorText,
    Problem,
    QueueName,
    ReplayBody,
    RunAt,
    TypeName,
    UpdateBody,
    UrlId,
    WaitSeconds,
)
from .common import UNKNOWN, Api, JobId, NotFound, Served, job
from .common import router as make_router

PAGE_LIMIT = 1000
"""The most jobs GET /jobs returns at once."""
PAGE_BYTES = 8 * 1024 * 1024
"""About the most JSON (payloads, results, milestones) one page of GET /jobs holds: past it, the
page ends early with a `next_before` (a page holds at least one job, whatever its size)."""

router = make_router("jobs")


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobAnswer,
    response_description="the job, enqueued",
    responses={
        200: {
            "model": JobAnswer,
            "description": "the existing job of that idempotency key or unique key",
        },
        404: {"model": Problem, "description": "a job of `after` does not exist"},
        409: {"model": Problem},
    },
)
async def create_job(body: EnqueueBody, api: Served) -> Response:
    """Enqueue a job: 201 with it, 200 with the existing one when its idempotency key holds
    the same type and payload (409 when it holds another, or is a job of `after`), or when
    a live job holds its unique key (with `replace`, that pending job changed; 409 while it
    runs); 404 when a job of `after` does not exist."""
    if body.run_at is not None and body.delay is not None:
        raise ValidationError("run_at", "give run_at or delay, not both")
    add = known_enqueue(api.config.registry, body.type, body.payload)
    options = _options(body)
    async with api.transaction() as conn:
        try:
            result = await add(conn, body.type, body.payload, **options, schema=api.schema)
        except ValidationError as exc:
            if exc.field == "after" and UNKNOWN_PARENT in str(exc):
                return guard.problem(404, str(exc), "after")
            if exc.field == "after" and SELF_PARENT in str(exc):
                return guard.problem(409, str(exc), "after")
            raise
        return answer(job_json(result.job), 201 if result.created else 200)


def known_enqueue(
    registry: Registry | None, type: str, payload: Any
) -> Callable[..., Awaitable[EnqueueResult]]:
    """How POST /jobs and the console's enqueue form enqueue `type`, its payload checked first,
    before any database is reached (a refusal answers even while the database does not): a type
    of the `registry` (`serve --app`) with its task's defaults and its payload checked (a typed
    task's strictly, as JSON Schema reads its schema: what the OpenAPI document promises); any
    other type as `pgworker.enqueue` does."""
    if registry is not None and type in registry:
        registry.checked_json(type, payload)
        return registry.enqueue
    return enqueue


def _options(body: EnqueueBody) -> dict[str, Any]:
    """The enqueue options the body gives, by name (models.ENQUEUE_OPTIONS): left out, null."""
    options = {name: getattr(body, name) for name in ENQUEUE_OPTIONS}
    if body.run_at is not None:
        options["run_at"] = validate.moment("run_at", body.run_at)
    options["replace"] = bool(body.replace)
    return options


@router.get(
    "/jobs/{id}",
    response_model=JobDetail,
    responses={
        **UNKNOWN,
        200: {
            "description": "the job; with `wait`, once it ended or the wait ran out",
            "headers": {
                "Pgworker-Wait": {
                    "description": "with `wait` only: whether the job ended",
                    "schema": {"type": "string", "enum": ["ended", "timeout"]},
                }
            },
        },
    },
)
async def get_job(
    id: JobId,
    request: Request,
    api: Served,
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
    waited = None if wait is None else await _ended(api, id, wait, request)
    if waited == "gone":
        return Response(status_code=499)  # nobody reads it: the client left
    q = api.queries
    async with api.transaction() as conn:
        row = await job(api, conn, id)
        attempts = [plain(dict(r)) for r in await q.job_attempts_of(conn, id)]
        return answer(
            job_json(
                row,
                attempt_history=attempts,
                milestones=with_json(await q.job_milestones_of(conn, id), "detail"),
                steps=with_json(await q.job_steps_of(conn, id), "result"),
            ),
            headers=None if waited is None else {"Pgworker-Wait": _wait_word(row)},
        )


async def _ended(api: Api, job_id: int, seconds: float, request: Request) -> str:
    """Wait up to `seconds` for the job's end through the process's one waiter (_waits.py),
    holding no connection of the pool: "ended", "timeout", or "gone" (the client left).
    Whether it ended is then said from the job as read, which may have ended since."""
    outcome = "timeout"
    async with anyio.create_task_group() as tg:

        async def end() -> None:
            nonlocal outcome
            try:
                await wait_for_end(api.pool(), job_id, seconds, schema=api.schema)
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
        raise NotFound(job_id)
    return outcome


def _wait_word(row: Row) -> str:
    """`Pgworker-Wait`: "ended" when the job answered has ended, else "timeout"."""
    return "ended" if row["status"] in FINISHED else "timeout"


@router.get("/jobs", response_model=JobPage, response_description="a page of jobs, newest first")
async def list_jobs(
    api: Served,
    status: Annotated[JobStatus | None, Query()] = None,
    type: Annotated[TypeName | None, Query(description="the types starting with this text")] = None,
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
    error_group: Annotated[
        ErrorGroup | None,
        Query(description="the jobs whose latest error is of this failure group (GET /failures)"),
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
        error_group=error_group,
    )
    q = api.queries
    async with api.transaction() as conn:
        await q.plan_with_values(conn)
        rows, more = await q.http_jobs_list(
            conn, job_filter.params(), before=before, limit=limit, budget=PAGE_BYTES
        )
        jobs = [job_json(r) for r in rows]
        return answer({"jobs": jobs, "next_before": jobs[-1]["id"] if more and jobs else None})


@router.patch(
    "/jobs/{id}",
    response_model=JobAnswer,
    response_description="the job, changed",
    responses={**UNKNOWN, 409: {"model": Problem, "description": "the job is not pending"}},
)
async def update_pending_job(
    id: JobId, body: UpdateBody, request: Request, api: Served
) -> Response:
    """Change a pending job's `run_at`, `priority` or `payload` (at least one): 200 with the
    job, 409 once it runs or ended (nothing changed), 422 for a bad value or a run_at for a
    parked job."""
    async with api.transaction() as conn:
        found = await job(api, conn, id)
        payload = body.payload
        if payload is not None and api.config.registry is not None:
            payload = api.config.registry.checked_json(found["type"], payload)
        changed = await update_job(
            conn,
            id,
            run_at=validate.moment("run_at", body.run_at) if body.run_at is not None else None,
            priority=body.priority,
            payload=payload,
            by=guard.actor(request.scope, None, "api"),
            schema=api.schema,
        )
        return answer(job_json(await job(api, conn, changed.id)))


@router.post(
    "/jobs/{id}/cancel",
    response_model=CancelledJob,
    response_description="the job, and what the cancel did",
    responses=UNKNOWN,
)
async def cancel_job(id: JobId, api: Served) -> Response:
    """Cancel a pending job, or ask the worker of a running one to stop it (its heartbeat
    says `cancel_requested`); a finished job is left as it is. 200 with the job and `cancel`:
    cancelled, cancelling or already <status>."""
    async with api.transaction() as conn:
        await job(api, conn, id)
        outcome = await cancel(conn, id, schema=api.schema)
        return answer(job_json(await job(api, conn, id), cancel=outcome.value))


@router.post(
    "/jobs/{id}/replay",
    response_model=JobAnswer,
    response_description="the job, pending again",
    responses={
        **UNKNOWN,
        409: {
            "model": Problem,
            "description": "the job is not failed nor cancelled, or a live job holds its "
            "unique key",
        },
    },
)
async def replay_job(
    id: JobId, request: Request, api: Served, body: ReplayBody | None = None
) -> Response:
    """Run a failed or cancelled job again: pending now, its retries afresh; 409 for a job
    in another status."""
    body = body or ReplayBody.model_validate({})
    by = guard.actor(request.scope, body.by, "api")
    async with api.transaction() as conn:
        row = await job(api, conn, id)
        done, announce = await replay_uncommitted(
            conn, [id], by=by, reason=body.reason, schema=api.schema
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
        found = answer(job_json(await job(api, conn, id)))
    announce()
    return found
