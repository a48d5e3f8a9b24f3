"""GET /stats, the dashboard's charts as JSON, and GET /periodic, the periodic schedules."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response

from ...operations import list_periodic
from .. import charts
from ..answers import Schedules, answer, plain
from ..charts import StatsAnswer, StatsWindow
from ..schemas import QueueName, TypeName
from .common import Served
from .common import router as make_router

router = make_router("operators")


@router.get("/stats", response_model=StatsAnswer, response_description="the charts' series")
async def get_stats(
    api: Served,
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
    async with api.transaction() as conn:
        return answer(await charts.stats(conn, api.queries, window.value, queue, type))


@router.get("/periodic", response_model=Schedules, response_description="the schedules")
async def list_schedules(api: Served) -> Response:
    """The periodic schedules the database records, by name (at most 1,000): each one's
    task, `schedule` (when it runs), `last_slot` enqueued and its job (`last_job_id`,
    `last_job_status`), `next_slot`, and `checked_at` (when a worker defining it last
    looked)."""
    async with api.transaction() as conn:
        found = await list_periodic(conn, schema=api.schema)
        schedules = [
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
        return answer({"schedules": schedules})
