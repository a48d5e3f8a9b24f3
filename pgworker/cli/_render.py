"""What the commands print: pure functions from what `operations` returns to text or JSON. No
database, no printing. `pgworker status` from the rows of `operations.status` (mappings with the
columns of sql/queries/status_*.sql); `failed list`, `show`, `replay`, `prune` and the `queue`
commands below.

Text from the database (types, queues, errors, tracebacks, worker ids, milestones, payloads) is
anybody's: the CLI passes everything it prints through `_terminal.terminal` (cli.say), and a value
that sits on one line of a table or list goes through `_terminal.cell` (its newlines too), so it
cannot fake a line."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from .._terminal import cell
from ..models import JOB_FIELDS, JobStatus
from ..operations import waiting_for

if TYPE_CHECKING:
    from ..operations import FailedJob, FailureGroup, PeriodicSchedule, QueueState, ReplayResult

STATUSES = tuple(s.value for s in JobStatus)

Rows = Mapping[str, Sequence[Mapping[str, Any]]]
"""What `operations.status` returns: counts, oldest_pending, unserved and workers rows (and
controls: the QueueState of each queue paused or limited)."""


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
        (cell(q), *(str(c[s]) for s in STATUSES), age(oldest.get(q)))
        for q, c in sorted(queues.items())
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
            f"  {cell(w['worker_id'])}  queues={cell(','.join(w['queues']))}  "
            f"types={cell(','.join(w['types']))}"
        )
    return lines


def unserved(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The warning about pending (queue, type, payload version) triples that no live worker
    serves, the version said when it is not 1; none if none."""
    if not rows:
        return []
    return [
        "pending types that no live worker serves:",
        *(f"  {cell(u['queue'])}: {cell(u['type'])}{_version(u)}" for u in rows),
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
    """The table, the live workers, the unserved warning, and the queues paused and limited,
    separated by blank lines."""
    oldest = {r["queue"]: r["age"] for r in found["oldest_pending"]}
    blocks = [
        table(counts(found["counts"]), oldest),
        workers(found["workers"]),
        unserved(found["unserved"]),
        paused(found.get("controls", ())),
        limited(found.get("controls", ())),
    ]
    return "\n\n".join("\n".join(block) for block in blocks if block)


def paused(states: Sequence[Any]) -> list[str]:
    """The paused queues: one line each, since when, by whom, why; none if none."""
    shown = [s for s in states if s.paused]
    if not shown:
        return []
    return [
        f"paused queues: {len(shown)}",
        *(f"  {_cut(s.name, NAME_WIDTH)}: {_paused_by(s)}" for s in shown),
    ]


def limited(states: Sequence[Any]) -> list[str]:
    """The queues with a limit: one line each with its limits; none if none."""
    shown = [s for s in states if s.limits]
    if not shown:
        return []
    return [
        f"limited queues: {len(shown)}",
        *(f"  {_cut(s.name, NAME_WIDTH)}: {_limits_text(s)}" for s in shown),
    ]


def status_json(found: Rows) -> str:
    """The same as a JSON document: per queue its counts and the oldest pending job's age in
    seconds (null when none is due), the live workers, the unserved pairs, and `controls`: the
    queues paused or limited (queue, paused, paused_at, paused_by, pause_reason, limits)."""
    controls: Sequence[Any] = found.get("controls", ())
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
            "controls": [
                {k: v for k, v in c.as_json().items() if k not in ("pending", "running")}
                for c in controls
            ],
        },
        indent=2,
    )


# --- failed jobs, show, replay, prune -------------------------------------------------------

ERROR_WIDTH = 80
"""The most characters of an error a table line shows."""
NAME_WIDTH = 200
"""The widest name a table shows (the longest task, schedule or author name pgworker accepts):
a longer one was written in the database by hand, and is cut so that it does not widen every
line of the table to its length."""


def when(moment: datetime | None) -> str:
    """A time as ISO 8601 in UTC to the second (2030-01-01T09:00:00Z); `-` for none."""
    if moment is None:
        return "-"
    if moment.year == 9999:  # a parked job's run_at ('infinity')
        return "infinity (parked: when released)"
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cut(text: str | None, width: int = ERROR_WIDTH) -> str:
    """One line of at most `width` characters (… when cut); `-` for none."""
    if not text:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _aligned(cells: Sequence[Sequence[str]]) -> list[str]:
    rows = [[cell(c) for c in r] for r in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


aligned = _aligned
"""Rows of cells as aligned lines (each cell on one line, its control characters escaped)."""
one_line = _cut
"""A text on one line, cut to the width of an error line."""


def failed_text(jobs: Sequence[FailedJob]) -> str:
    """`pgworker failed list`: one line per failed job under a header; `(no failed jobs)`."""
    if not jobs:
        return "(no failed jobs)"
    header = ("id", "type", "queue", "correlation id", "attempts", "first attempt", "last attempt")
    rows = [
        (
            str(j.id),
            j.type,
            j.queue,
            j.correlation_id,
            str(j.attempts),
            when(j.first_attempt_at),
            when(j.last_attempt_at),
        )
        for j in jobs
    ]
    lines = _aligned([header, *rows])
    out = [lines[0]]
    for line, job in zip(lines[1:], jobs, strict=True):
        out += [line, f"    {_cut(job.error)}"]
    return "\n".join(out)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def failed_json(jobs: Sequence[FailedJob]) -> str:
    """The same as a JSON array of objects with exactly the keys id, type, queue,
    correlation_id, attempts, first_attempt_at, last_attempt_at (ISO 8601 or null) and error
    (its first line, or null)."""
    return json.dumps(
        [
            {
                "id": j.id,
                "type": j.type,
                "queue": j.queue,
                "correlation_id": j.correlation_id,
                "attempts": j.attempts,
                "first_attempt_at": _iso(j.first_attempt_at),
                "last_attempt_at": _iso(j.last_attempt_at),
                "error": j.error,
            }
            for j in jobs
        ],
        indent=2,
    )


_SPARKS = " ▁▂▃▄▅▆▇█"


def sparkline(counts: Sequence[int]) -> str:
    """Counts as a line of block characters, the largest one full (a blank for none)."""
    peak = max(counts, default=0)
    if not peak:
        return " " * len(counts)
    return "".join(
        _SPARKS[0 if not n else max(1, round(n * (len(_SPARKS) - 1) / peak))] for n in counts
    )


def groups_text(groups: Sequence[FailureGroup]) -> str:
    """`pgworker failed groups`: one line per group under a header, its sample error below;
    `(no failures)`."""
    if not groups:
        return "(no failures)"
    header = ("fingerprint", "count", "type", "error class", "first seen", "last seen", "24 h")
    rows = [
        (
            g.fingerprint,
            f"{g.count:,}",
            g.type,
            g.error_class,
            when(g.first_seen),
            when(g.last_seen),
            sparkline(g.trend),
        )
        for g in groups
    ]
    lines = _aligned([header, *rows])
    out = [lines[0]]
    for line, group in zip(lines[1:], groups, strict=True):
        out += [line, f"    {_cut(group.sample)}"]
    return "\n".join(out)


def groups_json(groups: Sequence[FailureGroup]) -> str:
    """The same as a JSON array, each group as GET /failures answers it: fingerprint, type,
    error_class, count, first_seen, last_seen (ISO 8601), sample and trend."""
    return json.dumps([g.as_json() for g in groups], indent=2, ensure_ascii=False)


def _plain(value: Any) -> Any:
    """What json.dumps cannot write, made JSON (its `default`): times as ISO 8601, enums as
    their value, other mappings as dicts. The encoder walks the rest: payloads and results
    nested as deep as enqueue allows are never walked by a recursion of this module's."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


SHOWN = (
    "status",
    "type",
    "queue",
    "version",
    "priority",
    "attempts",
    "retry_count",
    "max_retries",
    "correlation_id",
    "idempotency_key",
    "concurrency_key",
    "unique_key",
    "created_at",
    "run_at",
    "finished_at",
    "worker_id",
    "error",
)
"""The fields of a job `pgworker show` lists, in this order (then progress, payload, result)."""


def _job(found: Mapping[str, Any]) -> dict[str, Any]:
    """The job's columns, its payload the redacted one that show_job gives."""
    job = found["job"]
    return {
        **{name: getattr(job, name) for name in JOB_FIELDS},
        "payload": found["payload"],
    }


def show_json(found: Mapping[str, Any]) -> str:
    """`pgworker show --json`: {"job": its columns (payload redacted), "parents" (id -> status,
    null once pruned), "waits_for" (the parents not ended), "milestones", "steps", "attempts",
    "events", "waits"}, times as ISO 8601."""
    return json.dumps(
        {
            "job": _job(found),
            "parents": {str(i): status for i, status in found.get("parents", {}).items()},
            "waits_for": found.get("waits_for", []),
            "milestones": found["milestones"],
            "steps": found["steps"],
            "attempts": found["attempts"],
            "events": found["events"],
            "waits": found.get("waits", []),
        },
        default=_plain,
        indent=2,
    )


def _compact(value: Any) -> str:
    return json.dumps(value, default=_plain, ensure_ascii=False)


def show_text(found: Mapping[str, Any]) -> str:
    """`pgworker show`: the job's fields, then its milestones, steps, attempts and events."""
    job = _job(found)
    width = max(len(n) for n in (*SHOWN, "progress"))
    lines = [f"job {job['id']}"]
    for name in SHOWN:
        value = job[name]
        shown = when(value) if isinstance(value, datetime) else _cut(str(value), 200)
        lines.append(f"  {name.ljust(width)}  {'-' if value is None else shown}")
    for name in ("progress", "payload", "result"):
        lines.append(f"  {name.ljust(width)}  {_compact(job[name])}")
    parents = found.get("parents") or {}
    if parents:
        waits = found.get("waits_for", [])
        lines += ["", f"parents: {len(parents)}, waits for {len(waits)}"]
        lines += [
            f"  {i}  {'pruned' if status is None else status}"
            + ("  (waited for)" if i in waits else "")
            for i, status in parents.items()
        ]
    waits = found.get("waits", [])
    waiting = waiting_for(found["job"], waits)
    if waiting is not None:
        lines.append(f"  {'waits'.ljust(width)}  waits for {cell(waiting)}")
    lines += ["", f"milestones: {len(found['milestones'])}"]
    lines += [
        f"  {when(m['at'])}  attempt {m['attempt']}  {cell(m['milestone'])}"
        + ("" if m["detail"] is None else f"  {_compact(m['detail'])}")
        for m in found["milestones"]
    ]
    lines += ["", f"steps: {len(found['steps'])}"]
    lines += [
        f"  {cell(s['name'])}  attempt {s['attempt']}  {when(s['finished_at'])}  "
        f"{_cut(_compact(s['result']), 120)}"
        for s in found["steps"]
    ]
    lines += ["", f"attempts: {len(found['attempts'])}"]
    for a in found["attempts"]:
        lines.append(
            f"  #{a['attempt']}  {a['outcome']}  worker {cell(a['worker_id'])}  "
            f"{when(a['started_at'])} to {when(a['finished_at'])}"
            + ("" if a.get("wait_ms") is None else f"  wait {a['wait_ms']:.1f} ms")
            + ("" if a.get("run_ms") is None else f"  run time {a['run_ms']:.1f} ms")
        )
        if a["error_type"] or a["error_message"]:
            error = ": ".join(e for e in (a["error_type"], a["error_message"]) if e)
            lines.append(f"      {_cut(error, 200)}")
    if waits:
        lines += ["", f"event waits: {len(waits)}"]
        lines += [
            f"  #{w['seq']}  {cell(w['name'])}  attempt {w['attempt']}  "
            + (
                f"delivered {when(w['delivered_at'])}  {_cut(_compact(w['data']), 120)}"
                if w["event_id"] is not None
                else "timed out"
                if w["timed_out"]
                else "waiting" + ("" if w["deadline"] is None else f" until {when(w['deadline'])}")
            )
            for w in waits
        ]
    lines += ["", f"events: {len(found['events'])}"]
    lines += [
        f"  {when(e['at'])}  {e['kind']} by {cell(e['actor'] or '-')}"
        + (f": {_cut(e['reason'], 200)}" if e["reason"] else "")
        for e in found["events"]
    ]
    return "\n".join(lines)


def replay_text(result: ReplayResult) -> str:
    """What `pgworker replay` prints on stdout: one line per job replayed (or, in a dry run,
    that would be)."""
    verb = "would replay" if result.dry_run else "replayed"
    if not result.replayed:
        return f"nothing to replay{' (dry run)' if result.dry_run else ''}"
    return "\n".join(f"{verb} job {i}" for i in result.replayed)


def skipped_lines(result: ReplayResult) -> list[str]:
    """Why the jobs left alone were: one line each, for stderr."""
    return [
        f"job {i} is {status}: its unique key is held by live job {result.held[i]}; left as it is"
        if i in result.held
        else f"job {i} is {status}: only failed or cancelled jobs are replayed; left as it is"
        for i, status in sorted(result.skipped.items())
    ]


def prune_text(pruned: Mapping[str, int], dry_run: bool) -> str:
    """What `pgworker prune` prints: the jobs deleted (or that would be), in all and by status."""
    verb = "would prune" if dry_run else "pruned"
    by_status = ", ".join(f"{status} {n}" for status, n in pruned.items())
    return f"{verb} {sum(pruned.values())} jobs ({by_status})"


def periodic_text(schedules: Sequence[PeriodicSchedule]) -> str:
    """`pgworker periodic list`: one line per schedule under a header; `(no periodic schedules)`."""
    if not schedules:
        return "(no periodic schedules)"
    header = ("name", "task", "schedule", "last slot", "last job", "next slot", "checked")
    rows = [
        (
            _cut(s.name, NAME_WIDTH),
            _cut(s.task, NAME_WIDTH),
            _cut(s.schedule, NAME_WIDTH),
            when(s.last_slot),
            "-" if s.last_job_id is None else f"{s.last_job_id} {s.last_job_status}",
            when(s.next_slot),
            when(s.checked_at),
        )
        for s in schedules
    ]
    return "\n".join(_aligned([header, *rows]))


# --- queue pause, resume, list -----------------------------------------------------------------


def _paused_by(state: QueueState) -> str:
    said = f"paused since {when(state.paused_at)} by {_cut(state.paused_by, NAME_WIDTH)}"
    return said + (f": {_cut(state.reason)}" if state.reason else "")


def queue_change_text(state: QueueState, verb: str) -> str:
    """What `queue pause` and `queue resume` print: what was done (or that nothing needed
    doing), and, for a queue nothing named before, that its controls were created."""
    name = cell(state.name)
    if verb == "pause":
        said = (
            f"paused queue {name}" if state.changed else f"queue {name} was already paused"
        ) + f" ({_paused_by(state).removeprefix('paused ')})"
        if state.changed:
            said += "; its running jobs finish, its pending jobs wait"
    else:
        said = (
            f"resumed queue {name}: its workers claim its jobs now"
            if state.changed
            else f"queue {name} was not paused: nothing to resume"
        )
    if not state.known:
        said += f"\nnote: no pending job, worker or earlier control named queue {name}"
        if verb == "pause":
            said += ": a new queue, paused before its first job (check the spelling)"
    return said


def _limits_text(state: QueueState) -> str:
    """`max_running 5, rate 600/m`, or `no limit`."""
    said = []
    if state.max_running is not None:
        said.append(f"max_running {state.max_running}")
    if state.rate is not None:
        said.append(f"rate {state.rate}")
    return ", ".join(said) or "no limit"


def queue_limit_text(state: QueueState, *, cleared: bool = False) -> str:
    """What `queue limit` prints: the queue's limits now, and whether this changed them (a
    limit that already was so changes nothing); for a queue nothing named before, that its
    controls were created."""
    name = cell(state.name)
    if state.changed:
        said = f"limited queue {name}: {_limits_text(state)}"
        said += " (every worker obeys it from its next claim)"
    elif cleared:
        said = f"queue {name} had no limit: nothing to clear"
    else:
        said = f"queue {name} already had these limits: {_limits_text(state)}; nothing changed"
    if not state.known:
        said += f"\nnote: no pending job, worker or earlier control named queue {name}"
        if state.changed:
            said += ": a new queue, limited before its first job (check the spelling)"
    return said


def queues_text(states: Sequence[QueueState]) -> str:
    """`pgworker queue list`: one line per queue under a header; `(no queues)` when none."""
    if not states:
        return "(no queues)"
    header = (
        "queue",
        "state",
        "pending",
        "running",
        "max_running",
        "rate",
        "since",
        "by",
        "reason",
    )
    rows = [
        (
            _cut(q.name, NAME_WIDTH),
            "paused" if q.paused else "active",
            str(q.pending if q.pending is not None else "-"),
            str(q.running if q.running is not None else "-"),
            str(q.max_running if q.max_running is not None else "-"),
            q.rate or "-",
            when(q.paused_at),
            _cut(q.paused_by, NAME_WIDTH),
            _cut(q.reason, 60),
        )
        for q in states
    ]
    return "\n".join(_aligned([header, *rows]))


def periodic_json(schedules: Sequence[PeriodicSchedule]) -> str:
    """The same as a JSON array of objects with exactly the keys name, task, schedule,
    last_slot, next_slot, checked_at (ISO 8601 or null), last_job_id and last_job_status."""
    return json.dumps(
        [
            {
                "name": s.name,
                "task": s.task,
                "schedule": s.schedule,
                "last_slot": _iso(s.last_slot),
                "next_slot": _iso(s.next_slot),
                "last_job_id": s.last_job_id,
                "last_job_status": s.last_job_status,
                "checked_at": _iso(s.checked_at),
            }
            for s in schedules
        ],
        indent=2,
    )


def queues_json(states: Sequence[QueueState]) -> str:
    """The same as a JSON array of objects with the keys queue, paused, paused_at (ISO 8601 or
    null), paused_by, pause_reason, pending, running and limits (an object with max_running and
    rate, each only when set: empty when the queue has no limit)."""
    return json.dumps([q.as_json() for q in states], indent=2)
