"""The workers' side of a job, for workers in any language: claim (POST /jobs/claim), then
heartbeat, complete or fail the attempt; and GET /workers, the workers known.

HTTP claims are durable (synchronous_commit on), so the attempt number alone, with the worker's
id, fences a heartbeat, a completion or a failure: once another attempt holds the job (the lease
expired and the job was rescued and claimed again), the old one's writes get 409."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi import Request, Response

from ... import _validate as validate
from ..._db.queries import Row
from ..._redact import detail, redactor, summary
from ...errors import ValidationError
from ...models import DEFAULT_MAX_RETRIES, AttemptResult, JobStatus, Outcome
from ...retry import RetryPolicy, next_retry, why_final
from ..answers import (
    BeatJob,
    ClaimedJob,
    JobAnswer,
    Workers,
    answer,
    columns,
    decoded,
    job_json,
    plain,
)
from ..bounds import Unanswered
from ..schemas import ClaimBody, CompleteBody, FailBody, HeartbeatBody
from .common import FENCED, UNKNOWN, Api, Fenced, JobId, NotFound, Served, job
from .common import router as make_router

DEFAULT_LEASE = 30.0
"""Seconds an HTTP claim (or heartbeat) holds its job when the request gives no lease."""
POISON_SKIPS = 100
"""The most jobs with an unreadable payload one claim fails (each for good) before its 204."""

router = make_router()


@router.post(
    "/jobs/claim",
    tags=["workers"],
    response_model=ClaimedJob,
    response_description="the job claimed, and its attempt",
    responses={204: {"description": "nothing is due"}},
)
async def claim(body: ClaimBody, request: Request, api: Served) -> Response:
    """Claim the next due job: 200 with it and its `attempt`, 204 when nothing is due."""
    worker_id = str(validate.name("worker_id", body.worker_id, validate.MAX_WORKER_ID_LENGTH))
    types = _names("types", body.types, validate.MAX_TYPE_LENGTH)
    queues = _names("queues", body.queues, validate.MAX_QUEUE_LENGTH)
    lease = _lease(body.lease)
    versions: dict[str, list[int]] = {}
    for type_, allowed in (body.versions or {}).items():
        validate.name("versions", type_, validate.MAX_TYPE_LENGTH)
        if not allowed:
            raise ValidationError("versions", "must list at least one version per type")
        versions[type_] = [validate.count("versions", v, minimum=1) for v in allowed]
    q = api.queries
    async with api.transaction() as conn:
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
            _, why = decoded(row["payload"])
            if why is None:
                return answer(job_json(row, attempt=row["attempts"]))
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


@router.post(
    "/jobs/{id}/heartbeat",
    tags=["workers"],
    response_model=BeatJob,
    response_description="the job, its lease extended",
    responses={**UNKNOWN, **FENCED},
)
async def heartbeat(id: JobId, body: HeartbeatBody, request: Request, api: Served) -> Response:
    """Extend the attempt's lease (by `lease` seconds, default 30): 200 with the job and
    `cancel_requested` (an operator asked to stop it), 409 when the attempt no longer holds
    the job, 503 when its row is locked by another session (the lease was not extended)."""
    lease = _lease(body.lease)
    q = api.queries
    async with api.transaction() as conn:
        row = await _held(api, conn, id, body, request)
        attempt = (id, body.attempt, row["claimed_at"])
        beat = (await q.worker_heartbeat(conn, [attempt], lease)).get((id, body.attempt))
        if beat is None:
            raise Fenced(id, body.attempt, await q.job_get(conn, id))
        if not beat.extended:  # rolled back and answered 503, as a lock waited on too long
            raise Unanswered(
                f"job {id}'s row is locked by another session: its lease was not extended "
                "and nothing was changed; send the heartbeat again"
            )
        return answer(job_json(await job(api, conn, id), cancel_requested=beat.cancel_requested))


@router.post(
    "/jobs/{id}/complete",
    tags=["workers"],
    response_model=JobAnswer,
    response_description="the job, completed",
    responses={**UNKNOWN, **FENCED},
)
async def complete(id: JobId, body: CompleteBody, request: Request, api: Served) -> Response:
    """The attempt succeeded: 200 with the job, completed (also when an operator asked to
    cancel it meanwhile, as for a Python handler that returns first: a heartbeat's
    `cancel_requested` is the time to stop; `fail` then ends it cancelled)."""
    text = _result_text(body.result) if "result" in body.model_fields_set else None
    async with api.transaction() as conn:
        row = await _held(api, conn, id, body, request)
        done = AttemptResult(
            id,
            body.attempt,
            row["claimed_at"],
            JobStatus.COMPLETED,
            Outcome.COMPLETED,
            text,
            run_ms=_since(row["claimed_at"]),
        )
        return await _finish(api, conn, done)


@router.post(
    "/jobs/{id}/fail",
    tags=["workers"],
    response_model=JobAnswer,
    response_description="the job, pending again for a retry, or failed",
    responses={**UNKNOWN, **FENCED},
)
async def fail(id: JobId, body: FailBody, request: Request, api: Served) -> Response:
    """The attempt failed: 200 with the job, pending again with `retry_count + 1` while its
    retries remain (after RetryPolicy()'s backoff, or `retry_after` seconds), else failed;
    failed at once when `permanent`. A job an operator asked to cancel ends cancelled
    either way (never retried, nor replayed with the failed ones)."""
    after = None if body.retry_after is None else validate.seconds("retry_after", body.retry_after)
    async with api.transaction() as conn:
        row = await _held(api, conn, id, body, request)
        values, _ = columns(row)  # a column that cannot be decoded does not stop the failure
        kind, message, full = _error_parts(body.error, values["payload"])
        policy = RetryPolicy()
        delay = None
        if not body.permanent:
            delay = next_retry(policy, values["retry_count"], values["max_retries"], after)
        if delay is None and not body.permanent:
            why = why_final(policy, values["retry_count"], values["max_retries"])
            message = message[: 500 - len(why)] + why
        status, outcome, wait, retried = (
            (JobStatus.FAILED, Outcome.FAILED, 0.0, 0)
            if delay is None
            else (JobStatus.PENDING, Outcome.RETRIED, delay, 1)
        )
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
        return await _finish(api, conn, written)


@router.get(
    "/workers",
    tags=["operators"],
    response_model=Workers,
    response_description="the workers known",
)
async def list_workers(api: Served) -> Response:
    """The workers known (Python and HTTP ones), with the ids of the jobs each runs."""
    async with api.transaction() as conn:
        rows = await api.queries.http_workers(conn)
        return answer({"workers": [plain(dict(r)) for r in rows]})


async def _held(api: Api, conn: Any, job_id: int, body: Any, request: Request) -> Row:
    """The job, while the attempt `body` names (worker_id, attempt) holds it; else 404/409."""
    worker_id = validate.name("worker_id", body.worker_id, validate.MAX_WORKER_ID_LENGTH)
    validate.count("attempt", body.attempt, minimum=1)
    q = api.queries
    row = await q.job_get(conn, job_id)
    if row is None:
        raise NotFound(job_id)
    await q.http_worker_seen(conn, worker_id, _host(request))
    if (row["status"], row["attempts"], row["worker_id"]) != ("running", body.attempt, worker_id):
        raise Fenced(job_id, body.attempt, row)
    return row


async def _finish(api: Api, conn: Any, result: AttemptResult) -> Response:
    written = await api.queries.job_finish_many(conn, [result])
    if result.job_id not in written:
        raise Fenced(result.job_id, result.attempt, await api.queries.job_get(conn, result.job_id))
    return answer(job_json(await job(api, conn, result.job_id)))


def _lease(given: float | None) -> float:
    return validate.seconds(
        "lease",
        DEFAULT_LEASE if given is None else given,
        maximum=validate.MAX_LEASE,
        zero=False,
    )


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


def _since(claimed_at: datetime) -> float:
    """An HTTP worker's run time, in ms: from its claim to its report (its handler's own time is
    not known here)."""
    return round(max((datetime.now(UTC) - claimed_at).total_seconds(), 0.0) * 1000, 1)


def _host(request: Request) -> str:
    return f"http:{request.client.host}" if request.client else "http"
