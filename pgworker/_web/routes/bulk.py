"""POST /jobs/actions/{replay,cancel,delete,reschedule}: the jobs matching a filter changed in
batches in the background (_bulk.Runner, of the console that created the action), GET
/jobs/actions/{id}, an action's progress, and GET /jobs/actions, the actions newest first."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from annotated_types import Interval
from fastapi import Path, Query, Request, Response

from ... import _bulk as bulk
from ... import _validate as validate
from ..._filters import JobFilter
from ...errors import ValidationError
from .. import guard
from ..answers import BulkAction, BulkActionPage, answer
from ..schemas import BulkBody, Decimal, Problem, RescheduleBody, UrlId
from .common import Api, Served
from .common import router as make_router

router = make_router("bulk")

_STARTED = "the action, created: it runs in the background"
PAGE_LIMIT = 500
"""The most actions GET /jobs/actions returns at once."""


async def _start(
    api: Api, kind: str, body: BulkBody, request: Request, run_at: Any = None
) -> Response:
    try:
        job_filter = JobFilter.checked(**body.filter.model_dump(exclude_none=True))
    except ValidationError as exc:
        reason = str(exc).removeprefix(f"{exc.field}: ")
        raise ValidationError(f"filter.{exc.field}", reason) from None
    async with api.transaction() as conn:
        action = await bulk.create(
            conn,
            kind,
            job_filter,
            run_at=None if run_at is None else validate.run_at(run_at),
            by=guard.actor(request.scope, body.by, "api"),
            reason=body.reason,
            holder=api.bulk_holder,
            schema=api.schema,
        )
        found = answer(action.as_json(), status_code=202)
    api.bulk_started()
    return found


@router.post(
    "/jobs/actions/replay",
    status_code=202,
    response_model=BulkAction,
    response_description=_STARTED,
)
async def bulk_replay(body: BulkBody, request: Request, api: Served) -> Response:
    """Replay every failed or cancelled job matching `filter` (whose keys are GET /jobs's
    query parameters), in batches in the background; each replay recorded in the job's
    events (actor `by`). The jobs enqueued after this request stay out."""
    return await _start(api, "replay", body, request)


@router.post(
    "/jobs/actions/cancel",
    status_code=202,
    response_model=BulkAction,
    response_description=_STARTED,
)
async def bulk_cancel(body: BulkBody, request: Request, api: Served) -> Response:
    """Cancel every pending job matching `filter`, and ask the workers of the running ones
    to stop them, in batches in the background; each recorded in the job's events."""
    return await _start(api, "cancel", body, request)


@router.post(
    "/jobs/actions/delete",
    status_code=202,
    response_model=BulkAction,
    response_description=_STARTED,
)
async def bulk_delete(body: BulkBody, request: Request, api: Served) -> Response:
    """Delete every finished (completed, failed, cancelled) job matching `filter`, with its
    attempts and history, in batches in the background; the ids deleted are recorded in
    the operator log. Pending and running jobs are left alone."""
    return await _start(api, "delete", body, request)


@router.post(
    "/jobs/actions/reschedule",
    status_code=202,
    response_model=BulkAction,
    response_description=_STARTED,
)
async def bulk_reschedule(body: RescheduleBody, request: Request, api: Served) -> Response:
    """Set `run_at` of every pending job matching `filter` (not those parked waiting for an
    event), in batches in the background; each recorded in the job's events."""
    return await _start(api, "reschedule", body, request, body.run_at)


@router.get(
    "/jobs/actions",
    response_model=BulkActionPage,
    response_description="a page of bulk actions, newest first",
)
async def bulk_list(
    api: Served,
    status: Annotated[
        Literal["running", "done", "failed"] | None, Query(description="only the actions in it")
    ] = None,
    limit: Annotated[int, Interval(ge=1, le=PAGE_LIMIT), Decimal, Query()] = 50,
    before: Annotated[UrlId | None, Query(description="only the actions below this id")] = None,
) -> Response:
    """The bulk actions, newest first: `actions` (each as GET /jobs/actions/{id} answers it:
    who asked, when, why, how many jobs, its progress) and `next_before`, the `before` of the
    next page (null on the last one)."""
    async with api.transaction() as conn:
        found = await bulk.recent(
            conn, state=status, before=before, limit=limit + 1, schema=api.schema
        )
        more = len(found) > limit
        actions = [a.as_json() for a in found[:limit]]
        return answer(
            {"actions": actions, "next_before": actions[-1]["id"] if more and actions else None}
        )


@router.get(
    "/jobs/actions/{id}",
    response_model=BulkAction,
    response_description="the action and its progress",
    responses={404: {"model": Problem, "description": "no such action"}},
)
async def bulk_progress(
    id: Annotated[UrlId, Path(description="the action's id")], api: Served
) -> Response:
    """A bulk action's progress: `status` (running, done, failed), `matched` (when it was
    created), `done` (jobs changed), `skipped` (left as they were: their status no longer
    fitted when their batch came), `error` (why it failed), `runner` (who runs it: its `id`,
    `kind`, `since` when, and `lease_until`, after which another runner adopts it)."""
    async with api.transaction() as conn:
        action = await bulk.get(conn, id, schema=api.schema)
        if action is None:
            return guard.problem(404, f"there is no bulk action {id}")
        return answer(action.as_json())
