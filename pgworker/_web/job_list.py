"""The dashboard's job list as people act on it: the order they choose (an allow-list of columns,
never SQL from the URL; a stable order, paged by key), and what holds each waiting job back (the
event it waits for, a paused queue, a queue's limit that is full), read for the rows shown only.

Pure of the pages' plumbing (dashboard.py calls it): bad input is a ValidationError naming the
query parameter, which the page shows as a 400."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from .. import _validate as validate
from .._db.queries import Queries, Row
from ..errors import ValidationError
from ..operations import queue_controls, rate_text
from . import dashboard_words as words

SORTS: dict[str, tuple[str, bool]] = {
    "created": ("Created", True),
    "run_at": ("Run at", False),
    "attempts": ("Attempts", True),
    "finished": ("Finished", True),
    "run_time": ("Run time", True),
}
"""The columns a list may be sorted by (the `sort` parameter: these words only, which
jobs_sorted.sql maps to its columns), each with its heading and whether it first sorts
descending (newest, most, longest first)."""
ORDERS = ("asc", "desc")


@dataclass(frozen=True, slots=True)
class Order:
    """The order a list is shown in: `sort` one of SORTS (None: newest id first, the default),
    `descending`, and `after`, the keyset of the page's start (the previous page's last row)."""

    sort: str | None = None
    descending: bool = True
    after: tuple[float | None, int] | None = None

    def query(self) -> dict[str, str]:
        """The query parameters that give this order back (without the page's start)."""
        if self.sort is None:
            return {}
        return {"sort": self.sort, "order": "desc" if self.descending else "asc"}


def order_of(params: Mapping[str, str]) -> Order:
    """The list's order from its query string: `sort` (one of SORTS), `order` (asc or desc,
    default the column's), `after` (a page's start, as the Next link gives it)."""
    sort = params.get("sort", "").strip() or None
    if sort is None:
        for field in ("order", "after"):
            if params.get(field):
                raise ValidationError(field, "goes with sort")
        return Order()
    if sort not in SORTS:
        raise ValidationError("sort", f"must be one of {', '.join(SORTS)}, got {sort[:40]!r}")
    given = params.get("order", "").strip()
    if given and given not in ORDERS:
        raise ValidationError("order", f"must be asc or desc, got {given[:40]!r}")
    descending = SORTS[sort][1] if not given else given == "desc"
    return Order(sort, descending, _after(params.get("after", "")))


def _after(text: str) -> tuple[float | None, int] | None:
    """`<sort key>|<id key>` (`none` for a row without the value), as `next_after` writes it."""
    if not text:
        return None
    value, _, key = text.partition("|")
    try:
        number = None if value == "none" else float(value)
        if number is not None and math.isnan(number):
            raise ValueError(text)
        ident = int(key)
        if len(text) > 60 or not -validate.MAX_BIGINT <= ident <= validate.MAX_BIGINT:
            raise ValueError(text)
    except ValueError:
        raise ValidationError(
            "after", "not a page of this list; start from its first page"
        ) from None
    return number, ident


def next_after(row: Row) -> str:
    """The `after` of the page that follows `row` (a row of jobs_sorted)."""
    value = row["sort_key"]
    return f"{'none' if value is None else repr(float(value))}|{row['id_key']}"


async def page(
    conn: Any,
    q: Queries,
    filters: Sequence[Any],
    order: Order,
    before: int | None,
    limit: int,
) -> tuple[list[Row], bool]:
    """The rows of one page (at most `limit`) and whether more follow: newest id first below
    `before` (jobs_filtered), or in `order` after its start (jobs_sorted)."""
    if order.sort is None:
        rows = await q.jobs_filtered(conn, filters, before, limit + 1)
    else:
        rows = await q.jobs_sorted(
            conn, filters, order.sort, order.descending, order.after, limit + 1
        )
    return list(rows[:limit]), len(rows) > limit


def headings(kept: Mapping[str, str], order: Order) -> dict[str, dict[str, str]]:
    """Each sortable column's link (its first press sorts it its usual way, the next reverses
    it), and `aria` (ascending, descending or none) for the column the list is sorted by."""
    found = {}
    for name, (label, first) in SORTS.items():
        current = order.sort == name
        descending = (not order.descending) if current else first
        query = {**kept, "sort": name, "order": "desc" if descending else "asc"}
        aria = ("descending" if order.descending else "ascending") if current else "none"
        found[name] = {"label": label, "query": urlencode(query), "aria": aria}
    return found


async def holds(conn: Any, q: Queries, rows: Sequence[Any], schema: str) -> Any:
    """What holds the shown pending jobs back by queue: `paused` (the names of the paused
    queues among them) and `held` (queue -> the words of its full limit)."""
    queues = sorted({r["queue"] for r in rows if r["status"] == "pending"})
    paused: set[str] = set()
    held: dict[str, str] = {}
    if not queues:
        return paused, held
    paused = {c.name for c in await queue_controls(conn, schema=schema) if c.paused}
    for r in await q.jobs_held(conn, queues):
        if r["max_running"] is not None and r["running"] >= r["max_running"]:
            held[r["queue"]] = f"at most {r['max_running']} running in queue {r['queue']}"
        elif r["rate_limit"] is not None and r["starts"] >= r["rate_limit"]:
            rate = rate_text(r["rate_limit"], r["rate_period"])
            held[r["queue"]] = f"at most {rate} starts in queue {r['queue']}"
    return paused, held


def state(
    row: Mapping[str, Any],
    paused: set[str],
    held: Mapping[str, str],
    now: datetime | None = None,
) -> words.State:
    """The row's state for a person, with what holds it back (see `holds`)."""
    queue = row["queue"]
    return words.state(row, now or datetime.now(UTC), paused=queue in paused, held=held.get(queue))
