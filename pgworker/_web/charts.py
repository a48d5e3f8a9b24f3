"""The numbers of the console's charts (issue 25, item 4), for GET /stats and the dashboard's
/ui/stats: per bucket of a window (the last hour by minute, the last day by ten minutes), the
jobs enqueued, the attempts completed and failed, and the p50 and p95 of the attempts' wait and
run time.

They read the attempts of the window along the indexes of job_attempts.started_at (its BRIN, or
(type, started_at) for one type) and the jobs enqueued along the BRIN index of jobs.created_at
(migration 22): their cost grows with the attempts in the window, not with the table, and the
percentiles are taken over a bounded sample (docs/operations/console.md gives the cost on a table
of five million attempts)."""

from __future__ import annotations

import enum
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from .. import _limits as limits
from .._db.queries import Queries
from ..errors import ValidationError

WINDOWS: dict[str, tuple[int, int]] = {"hour": (3600, 60), "day": (86400, 600)}
"""Each chart window: its length and its bucket, in seconds."""
SAMPLE = 20_000
"""About the most attempts the percentiles of one chart are taken over (stats_attempts.sql)."""
SERIES = ("enqueued", "completed", "failed", "wait_p50", "wait_p95", "run_p50", "run_p95")


async def stats(
    conn: Any, q: Queries, window: str, queue: str | None, type_: str | None
) -> dict[str, Any]:
    """The charts' numbers, one array per series aligned with `at` (each bucket's start, in
    seconds since the epoch), every bucket of the window present (0 or null when empty)."""
    if window not in WINDOWS:
        raise ValidationError("window", f"must be one of {', '.join(WINDOWS)}, got {window!r}")
    queue = None if queue is None else limits.name("queue", queue, limits.MAX_QUEUE_LENGTH)
    type_ = None if type_ is None else limits.name("type", type_, limits.MAX_TYPE_LENGTH)
    length, bucket = WINDOWS[window]
    now = datetime.now(UTC)
    last = int(now.timestamp()) // bucket * bucket
    first = last - length + bucket
    since = datetime.fromtimestamp(first, UTC)
    until = now + timedelta(seconds=1)
    if type_ is None:
        attempts = await q.stats_attempts(conn, since, until, bucket, queue, SAMPLE)
    else:
        attempts = await q.stats_attempts_type(conn, since, until, bucket, queue, SAMPLE, type_)
    enqueued = await q.stats_enqueued(conn, since, until, bucket, queue, type_)
    at = list(range(first, last + 1, bucket))
    index = {t: i for i, t in enumerate(at)}
    series: dict[str, list[Any]] = {
        name: [0 if name in ("enqueued", "completed", "failed") else None] * len(at)
        for name in SERIES
    }
    sampled = 1
    for r in attempts:
        i = index.get(int(r["bucket"].timestamp()))
        if i is None:
            continue
        for name in SERIES[1:]:
            series[name][i] = r[name]
        sampled = max(sampled, int(r["sampled"]))
    for r in enqueued:
        i = index.get(int(r["bucket"].timestamp()))
        if i is not None:
            series["enqueued"][i] = r["enqueued"]
    return {
        "window": window,
        "bucket_seconds": bucket,
        "queue": queue,
        "type": type_,
        "at": at,
        **series,
        "totals": {name: sum(series[name]) for name in ("enqueued", "completed", "failed")},
        "sampled": sampled,
    }


class StatsWindow(enum.StrEnum):
    HOUR = "hour"
    DAY = "day"


class StatsTotals(BaseModel):
    enqueued: int
    completed: int
    failed: int


class StatsAnswer(BaseModel):
    """GET /stats: one array per series, aligned with `at`."""

    window: StatsWindow
    bucket_seconds: int
    queue: str | None
    type: str | None
    at: list[int]
    enqueued: list[int]
    completed: list[int]
    failed: list[int]
    wait_p50: list[float | None]
    wait_p95: list[float | None]
    run_p50: list[float | None]
    run_p95: list[float | None]
    totals: StatsTotals
    sampled: int
