"""The operator log's entries in words: what a limit change set (the values, not just "limit"),
and a bulk action's one entry (its kind, how many jobs, its filter, the page of its progress).
Pure functions over the rows of sql/queries/dashboard_operator_log.sql; no database."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._filters import JobFilter
from ..errors import ValidationError
from ..operations import rate_text

BULK_PREFIX = "bulk_"
"""The operator_log action of a bulk action's entry: `bulk_replay`, `bulk_cancel`, ..."""


def limits_words(limits: Mapping[str, Any] | None) -> str:
    """`max_running 5, rate 10/s` from the limits a `limit` entry records, or `no limit`."""
    if not limits:
        return "no limit"
    said = []
    if limits.get("max_running") is not None:
        said.append(f"max_running {limits['max_running']}")
    rate = rate_text(limits.get("rate_limit"), limits.get("rate_period"))
    if rate is not None:
        said.append(f"rate {rate}")
    return ", ".join(said) or "no limit"


def _detail(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        found = json.loads(row["detail"]) if row["detail"] else {}
    except ValueError:  # detail written by hand: shown without it
        return {}
    return found if isinstance(found, dict) else {}


def entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row, with `what` (the action in words) and, for a bulk action's entry, `action_id`,
    `matched` and `filter` (its filter in words)."""
    found: dict[str, Any] = {**row, "what": row["action"], "action_id": None}
    if row["source"] != "queue":
        return found
    detail = _detail(row)
    action = str(row["action"])
    if action == "limit":
        new = detail.get("new") if isinstance(detail.get("new"), dict) else None
        old = detail.get("old") if isinstance(detail.get("old"), dict) else None
        found["what"] = f"limit: {limits_words(new)} (was {limits_words(old)})"
    elif action.startswith(BULK_PREFIX) and isinstance(detail.get("action_id"), int):
        matched = detail.get("matched")
        try:
            stored = detail.get("filter")
            words = JobFilter.parse(stored if isinstance(stored, dict) else {}).words()
        except ValidationError:  # a filter of an earlier release: said as it is stored
            words = json.dumps(detail.get("filter"))
        kind = action.removeprefix(BULK_PREFIX)
        found["what"] = f"bulk {kind}" + (
            f" of {matched:,} job{'s' if matched != 1 else ''}" if isinstance(matched, int) else ""
        )
        found["action_id"] = detail["action_id"]
        found["filter"] = words
    return found
