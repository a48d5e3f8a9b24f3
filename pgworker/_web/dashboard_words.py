"""What the dashboard says about a job, in the words of seed 001 (received, in progress — at
milestone X, needs attention, done) rather than the technical statuses; pure functions, no
database. A state says only what the row says: `done` is shown for a completed job and nothing
else, so the page never announces a success before it is real."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

STATUS_WORDS: dict[str, str] = {
    "pending": "received",
    "running": "in progress",
    "failed": "needs attention",
    "completed": "done",
    "cancelled": "cancelled",
}
"""The word for each status, used for counts and filters."""

OUTCOME_WORDS: dict[str, str] = {
    "running": "running",
    "completed": "done",
    "retried": "failed, retried",
    "failed": "failed, final",
    "timed_out": "timed out",
    "interrupted": "handed back (shutdown)",
    "cancelled": "cancelled",
    "lost": "worker lost",
    "snoozed": "snoozed",
    "waiting": "waiting for an event",
}

SHOWN_JSON = 256 * 1024
"""The most characters of one JSON value a page shows (a payload may hold 64 MB)."""


@dataclass(frozen=True, slots=True)
class State:
    word: str
    """received, in progress, needs attention, done, cancelled."""
    detail: str | None
    """What follows the word: `at milestone fetched`, `retrying after an error`, ..."""
    tone: str
    """The badge's colour class: wait, busy, bad, good, off."""
    status: str = ""
    """The technical status the word stands for, shown beside it (`needs attention · failed`):
    the word the API, the CLI and SQL use is never hidden."""

    @property
    def text(self) -> str:
        said = f"{self.word} — {self.detail}" if self.detail else self.word
        return f"{said} · {self.status}" if self.status and self.status != self.word else said


def state(
    job: Mapping[str, Any],
    now: datetime | None = None,
    *,
    paused: bool = False,
    held: str | None = None,
) -> State:
    """A job's state for a person, from its row (status, error, attempts, run_at, milestone;
    `event` and `event_deadline`: the event it waits for, ctx.wait_for_event), whether its
    queue is `paused`, and the limit that `held` its queue's due jobs back (its words), if any."""
    status = str(job["status"])
    if status == "pending" and paused:
        found = _pending(job, now, None)
        detail = "paused queue" if found.detail == "waiting for a worker" else found.detail
        if detail != "paused queue":
            detail = f"{detail}; paused queue"
        return State(found.word, detail, found.tone, status)
    if status == "pending":
        return _pending(job, now, held)
    milestone = job.get("milestone")
    at = f"at milestone {milestone}" if milestone else None
    if status == "running":
        return State("in progress", at, "busy", status)
    if status == "failed":
        return State("needs attention", None, "bad", status)
    if status == "completed":
        return State("done", None, "good", status)
    return State(STATUS_WORDS.get(status, status), None, "off", status)


def _pending(job: Mapping[str, Any], now: datetime | None, held: str | None) -> State:
    status = "pending"
    milestone = job.get("milestone")
    at = f"at milestone {milestone}" if milestone else None
    if job.get("error"):
        detail = f"{at}, retrying after an error" if at else "retrying after an error"
        return State("in progress", detail, "busy", status)
    run_at = job.get("run_at")
    left = job.get("parents_left")
    if left:
        return State(
            "received", f"waiting for {left} parent{'' if left == 1 else 's'}", "wait", status
        )
    event = job.get("event")
    if event is not None:
        deadline = job.get("event_deadline")
        until = "" if deadline is None else f" until {moment(deadline)}"
        return State("received", f"waits for event {event}{until}", "wait", status)
    if run_at is not None and run_at.year == datetime.max.year:  # parked (migration 19)
        return State("received", "waiting to be released", "wait", status)
    if run_at is not None and run_at > (now or datetime.now(UTC)):
        return State("received", f"scheduled for {moment(run_at)}", "wait", status)
    if held is not None:
        return State("received", f"held by limit: {held}", "wait", status)
    return State("received", "waiting for a worker", "wait", status)


def milestone_of(progress: Any) -> str | None:
    """The milestone name of `jobs.progress` (`{"milestone": ..., ...}`), if any."""
    if isinstance(progress, Mapping):
        name = progress.get("milestone")
        return str(name) if name is not None else None
    return None


def moment(value: datetime | None) -> str:
    """A time as people read it, in UTC to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def span(seconds: float | None) -> str:
    """A duration in words: 850 ms, 42 s, 3 min, 2.5 h, 4 days."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """`3 min ago` or `in 2 min`."""
    if value is None:
        return "-"
    delta = ((now or datetime.now(UTC)) - value).total_seconds()
    return f"{span(delta)} ago" if delta >= 0 else f"in {span(-delta)}"


def cut(text: str | None, width: int) -> str:
    """`text` cut at `width` characters (… when cut): a pause's author or reason longer than
    pause_queue accepts was written by hand, and would make every view of the page that long."""
    if not text:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def pretty(value: Any) -> str:
    """A JSON value laid out for reading, cut at SHOWN_JSON characters with a note."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (RecursionError, ValueError):
        text = json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > SHOWN_JSON:
        return f"{text[:SHOWN_JSON]}\n… (cut: {len(text):,} characters in all)"
    return text


def limits_text(state: Any) -> str:
    """A queue's limits in words: `at most 5 running, at most 600/m starts`, or `no limit`."""
    said = []
    if state.max_running is not None:
        said.append(f"at most {state.max_running} running")
    if state.rate is not None:
        said.append(f"at most {state.rate} starts")
    return ", ".join(said) or "no limit"
