"""`pgworker status` as text: pure functions from the rows of `operations.status` (mappings with
the columns of sql/queries/status_*.sql) to the table, or to JSON. No database, no printing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .models import JobStatus

STATUSES = tuple(s.value for s in JobStatus)

Rows = Mapping[str, Sequence[Mapping[str, Any]]]
"""What `operations.status` returns: counts, oldest_pending, unserved and workers rows."""


def age(seconds: float | None) -> str:
    """A duration in its largest unit, one decimal: 42.0s, 1.5m, 2.0h, 3.1d; `-` for none."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Jobs per queue and status, every status present (0 when none)."""
    queues: dict[str, dict[str, int]] = {}
    for r in rows:
        queues.setdefault(r["queue"], dict.fromkeys(STATUSES, 0))[r["status"]] = r["jobs"]
    return queues


def table(queues: Mapping[str, Mapping[str, int]], oldest: Mapping[str, float | None]) -> list[str]:
    """One line per queue (sorted) under a header, columns aligned; `(no jobs)` when empty."""
    header = ("queue", *STATUSES, "oldest pending")
    rows = [header] + [
        (q, *(str(c[s]) for s in STATUSES), age(oldest.get(q))) for q, c in sorted(queues.items())
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    if not queues:
        lines.append("(no jobs)")
    return lines


def workers(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The live workers: their count, then one line each with its queues and types."""
    lines = [f"live workers: {len(rows)}"]
    for w in rows:
        lines.append(
            f"  {w['worker_id']}  queues={','.join(w['queues'])}  types={','.join(w['types'])}"
        )
    return lines


def unserved(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The warning about pending (queue, type, payload version) triples that no live worker
    serves, the version said when it is not 1; none if none."""
    if not rows:
        return []
    return [
        "pending types that no live worker serves:",
        *(f"  {u['queue']}: {u['type']}{_version(u)}" for u in rows),
    ]


def _version(row: Mapping[str, Any]) -> str:
    version = row.get("version", 1)
    return "" if version == 1 else f" (version {version})"


def unserved_json(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The unserved triples as JSON objects: `queue` and `type`, and `version` when it is not 1
    (the objects of version 1 read as before versions existed)."""
    found: list[dict[str, Any]] = []
    for u in rows:
        version = u.get("version", 1)
        item = {"queue": u["queue"], "type": u["type"]}
        found.append(item if version == 1 else {**item, "version": version})
    return found


def status_text(found: Rows) -> str:
    """The table, the live workers, and the unserved warning, separated by blank lines."""
    oldest = {r["queue"]: r["age"] for r in found["oldest_pending"]}
    blocks = [
        table(counts(found["counts"]), oldest),
        workers(found["workers"]),
        unserved(found["unserved"]),
    ]
    return "\n\n".join("\n".join(block) for block in blocks if block)


def status_json(found: Rows) -> str:
    """The same as a JSON document: per queue its counts and the oldest pending job's age in
    seconds (null when none is due), the live workers, and the unserved pairs."""
    oldest = {r["queue"]: r["age"] for r in found["oldest_pending"]}
    return json.dumps(
        {
            "queues": {
                q: {**c, "oldest_pending_age_s": oldest.get(q)}
                for q, c in counts(found["counts"]).items()
            },
            "workers": [
                {"worker_id": w["worker_id"], "queues": w["queues"], "types": w["types"]}
                for w in found["workers"]
            ],
            "unserved": unserved_json(found["unserved"]),
        },
        indent=2,
    )
