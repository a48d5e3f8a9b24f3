"""The queues: GET /queues (their jobs by status, their controls), and the controls every worker
obeys: pause, resume and limit, each recorded in the operator log."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from ...errors import ValidationError
from ...models import JobStatus
from ...operations import (
    UNCHANGED,
    QueueState,
    limit_queue,
    pause_queue,
    queue_controls,
    resume_queue,
)
from .. import guard
from ..answers import QueueChange, Queues, answer
from ..schemas import QueueControlBody, QueueLimitBody
from .common import QueuePath, Served
from .common import router as make_router

router = make_router("operators")

_CHANGED = "the queue's controls as they now are"


@router.get("/queues", response_model=Queues, response_description="every queue")
async def list_queues(api: Served) -> Response:
    """Per queue (each that a job names or that has controls): the jobs by status, the age in
    seconds of the oldest due pending job (null when none is due), whether it is `paused`
    (`paused_at`, `paused_by`, `pause_reason`: null when not) and its `limits` (an object
    with `max_running` and `rate`, each only when set: empty when it has no limit)."""
    found: dict[str, dict[str, Any]] = {}
    q = api.queries
    async with api.transaction() as conn:
        for r in await q.status_counts(conn):
            entry = found.setdefault(r["queue"], _entry(r["queue"]))
            entry["counts"][r["status"]] = r["jobs"]
        for r in await q.status_oldest_pending(conn):
            entry = found.setdefault(r["queue"], _entry(r["queue"]))
            entry["oldest_pending_s"] = r["age"]
        for state in await queue_controls(conn, schema=api.schema):
            entry = found.setdefault(state.name, _entry(state.name))
            entry.update(_controls(state))
        return answer({"queues": [found[name] for name in sorted(found)]})


# `{queue:text}`: a queue's name may hold any character, a `/` (sent as %2F) too.
@router.post(
    "/queues/{queue:text}/pause", response_model=QueueChange, response_description=_CHANGED
)
async def pause(
    queue: QueuePath, request: Request, api: Served, body: QueueControlBody | None = None
) -> Response:
    """Pause the queue on every worker: no claim that starts once this commits takes its
    jobs; running ones finish, new ones wait as pending. Recorded in the operator log. 200
    with the queue's state and `changed` (false: it was paused already, left as it was,
    nothing logged) and `known` (false: no pending job, worker or earlier control named it;
    it is created, paused before its first job)."""
    body = body or QueueControlBody.model_validate({})
    async with api.transaction() as conn:
        state = await pause_queue(
            conn,
            queue,
            body.reason,
            by=guard.actor(request.scope, body.by, "api"),
            schema=api.schema,
        )
        return answer(_change(state))


@router.post(
    "/queues/{queue:text}/resume", response_model=QueueChange, response_description=_CHANGED
)
async def resume(
    queue: QueuePath, request: Request, api: Served, body: QueueControlBody | None = None
) -> Response:
    """Resume the queue: its workers are woken when this commits and claim its backlog at
    once. Recorded in the operator log. 200 with the queue's state, `changed` (false: it was
    not paused; nothing logged) and `known`."""
    body = body or QueueControlBody.model_validate({})
    async with api.transaction() as conn:
        state = await resume_queue(
            conn,
            queue,
            body.reason,
            by=guard.actor(request.scope, body.by, "api"),
            schema=api.schema,
        )
        return answer(_change(state))


@router.post(
    "/queues/{queue:text}/limit", response_model=QueueChange, response_description=_CHANGED
)
async def limit(queue: QueuePath, body: QueueLimitBody, request: Request, api: Served) -> Response:
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
    async with api.transaction() as conn:
        state = await limit_queue(
            conn,
            queue,
            max_running=body.max_running if "max_running" in given else UNCHANGED,
            rate=body.rate if "rate" in given else UNCHANGED,
            reason=body.reason,
            by=guard.actor(request.scope, body.by, "api"),
            schema=api.schema,
        )
        return answer(_change(state))


def _entry(name: str) -> dict[str, Any]:
    return {
        "queue": name,
        "counts": {s.value: 0 for s in JobStatus},
        "oldest_pending_s": None,
        **_controls(QueueState(name)),
    }


def _controls(state: QueueState) -> dict[str, Any]:
    """A queue's controls: whether it is paused, when, by whom, why; its limits."""
    found = state.as_json()
    return {k: found[k] for k in ("paused", "paused_at", "paused_by", "pause_reason", "limits")}


def _change(state: QueueState) -> dict[str, Any]:
    """What pause, resume and limit answer: the queue's controls, `changed` and `known`."""
    return {"queue": state.name, **_controls(state), "changed": state.changed, "known": state.known}
