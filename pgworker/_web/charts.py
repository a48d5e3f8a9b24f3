"""The numbers of the console's charts, for GET /stats and the dashboard's
/ui/stats: per bucket of a window (the last hour by minute, the last day by ten minutes), the
jobs enqueued, the attempts completed and failed, and the p50 and p95 of the attempts' wait and
run time.

They come from the per-minute rollup the maintenance leader keeps (migration 24,
sql/queries/stats_rollup.sql): whole minutes are read from it, at most 1,440 rows for a day,
and only the minutes it does not have yet (the last two or three; all of them right after an
upgrade, or while no worker runs maintenance) from job_attempts and jobs, at most
DIRECT_MINUTES of them, the newest; `unread_minutes` says how many were left out beyond those.
The counts are exact. The percentiles come from histograms of fixed buckets, a quarter of an
octave wide from 0.1 ms (`bucket_of`): the value shown is the middle of the bucket holding the
attempt at the percentile's rank, kept within the smallest and largest values measured, so within
HISTOGRAM_ERROR of it (docs/operations/console.md)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from .. import _validate as validate
from .._db.queries import Queries
from ..errors import ValidationError

WINDOWS: dict[str, tuple[int, int]] = {"hour": (3600, 60), "day": (86400, 600)}
"""Each chart window: its length and its bucket, in seconds."""
DIRECT_MINUTES = 120
"""The most minutes of a window read from job_attempts rather than the rollup (the newest)."""
SERIES = ("enqueued", "completed", "failed", "wait_p50", "wait_p95", "run_p50", "run_p95")
HISTOGRAM_BASE = 0.0001
"""The upper edge of bucket 0, in seconds: bucket k >= 1 holds [BASE * 2^((k-1)/STEPS),
BASE * 2^(k/STEPS)); the last one (HISTOGRAM_TOP) everything above too."""
HISTOGRAM_STEPS = 4
HISTOGRAM_TOP = 132
HISTOGRAM_ERROR = 2 ** (1 / (2 * HISTOGRAM_STEPS)) - 1
"""The largest relative error of a percentile at or above HISTOGRAM_BASE (9.05%)."""


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a value (as the SQL of stats_rollup.sql computes it)."""
    if seconds < HISTOGRAM_BASE:
        return 0
    step = math.floor(HISTOGRAM_STEPS * math.log(seconds / HISTOGRAM_BASE) / math.log(2))
    return min(1 + step, HISTOGRAM_TOP)


def middle(bucket: int) -> float:
    """The value a bucket stands for: its geometric middle (half the base for bucket 0)."""
    if bucket <= 0:
        return HISTOGRAM_BASE / 2
    return HISTOGRAM_BASE * 2 ** ((bucket - 0.5) / HISTOGRAM_STEPS)


def percentile(
    p: float,
    buckets: Sequence[int] | None,
    counts: Sequence[int] | None,
    low: float | None,
    high: float | None,
) -> float | None:
    """The `p` percentile (nearest rank) of a histogram, within [low, high]; None when empty."""
    if not buckets or not counts:
        return None
    rank = max(1, math.ceil(p * sum(counts)))
    seen = 0
    value = middle(buckets[-1])
    for bucket, n in zip(buckets, counts, strict=True):
        seen += n
        if seen >= rank:
            value = middle(bucket)
            break
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


async def stats(
    conn: Any, q: Queries, window: str, queue: str | None, type_: str | None
) -> dict[str, Any]:
    """The charts' numbers, one array per series aligned with `at` (each bucket's start, in
    seconds since the epoch), every bucket of the window present (0 or null when empty)."""
    if window not in WINDOWS:
        raise ValidationError("window", f"must be one of {', '.join(WINDOWS)}, got {window!r}")
    queue = None if queue is None else validate.name("queue", queue, validate.MAX_QUEUE_LENGTH)
    type_ = None if type_ is None else validate.name("type", type_, validate.MAX_TYPE_LENGTH)
    length, bucket = WINDOWS[window]
    now = datetime.now(UTC)
    last = int(now.timestamp()) // bucket * bucket
    first = last - length + bucket
    since = datetime.fromtimestamp(first, UTC)
    rows = await q.stats_window(conn, since, now, bucket, queue or "", type_ or "", DIRECT_MINUTES)
    at = list(range(first, last + 1, bucket))
    index = {t: i for i, t in enumerate(at)}
    series: dict[str, list[Any]] = {
        name: [0 if name in ("enqueued", "completed", "failed") else None] * len(at)
        for name in SERIES
    }
    unread = 0
    for r in rows:
        unread = int(r["unread"])
        i = None if r["bucket"] is None else index.get(int(r["bucket"].timestamp()))
        if i is None:
            continue
        for name in ("enqueued", "completed", "failed"):
            series[name][i] = int(r[name])
        for kind in ("wait", "run"):
            hist = (r[f"{kind}_buckets"], r[f"{kind}_counts"], r[f"{kind}_min"], r[f"{kind}_max"])
            series[f"{kind}_p50"][i] = percentile(0.5, *hist)
            series[f"{kind}_p95"][i] = percentile(0.95, *hist)
    return {
        "window": window,
        "bucket_seconds": bucket,
        "queue": queue,
        "type": type_,
        "at": at,
        **series,
        "totals": {name: sum(series[name]) for name in ("enqueued", "completed", "failed")},
        "sampled": 1,
        "unread_minutes": unread,
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
    """Always 1 since migration 24: the percentiles count every attempt."""
    unread_minutes: int
    """Minutes of the window neither rolled up nor read (more than DIRECT_MINUTES missing from
    the rollup: its maintenance is not running or still catching up); 0: every one counted."""
