"""GET /failures: the failures grouped as people think of them (operations.failure_groups), each
group's fingerprint one filter away from its jobs (GET /jobs?error_group=) and from a bulk
action over them."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from annotated_types import Interval
from fastapi import Query, Response

from ...operations import MAX_FAILURE_GROUPS, failure_groups
from ..answers import FailureGroupAnswer, answer
from ..schemas import Decimal, QueueName, RunAt, TypeName
from .common import Served
from .common import router as make_router

router = make_router("operators")


class FailureStatus(StrEnum):
    """Which failures GET /failures groups."""

    FAILED = "failed"
    """The jobs that ended failed, by their latest error."""
    RETRYING = "retrying"
    """The failed attempts of the jobs still being retried (pending or running now)."""


@router.get(
    "/failures",
    response_model=list[FailureGroupAnswer],
    response_description="the groups, the largest first",
)
async def list_failure_groups(
    api: Served,
    status: Annotated[FailureStatus, Query()] = FailureStatus.FAILED,
    type: Annotated[TypeName | None, Query(description="the types starting with this text")] = None,
    queue: Annotated[QueueName | None, Query()] = None,
    since: Annotated[
        RunAt | None, Query(description="ended at or after (default: the last 24 hours)")
    ] = None,
    limit: Annotated[int, Interval(ge=1, le=MAX_FAILURE_GROUPS), Decimal, Query()] = 50,
) -> Response:
    """The failures grouped by fingerprint (job type, exception class, the message with its
    values set aside, the innermost frame of its traceback), the largest groups first: with
    `status=failed` the jobs that ended failed since `since`, with `retrying` the failed
    attempts (started since `since`) of the jobs still pending or running. Each group: its
    `fingerprint` (`GET /jobs?error_group=` lists its jobs, a bulk action whose filter has
    `error_group` replays or cancels them), `type`, `error_class`, `count`, `first_seen`,
    `last_seen`, a `sample` error, and `trend`, its count in each hour of the last 24."""
    async with api.transaction() as conn:
        found = await failure_groups(
            conn,
            status=status.value,
            type=type,
            queue=queue,
            since=since,
            limit=limit,
            schema=api.schema,
        )
        return answer([g.as_json() for g in found])
