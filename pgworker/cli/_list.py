"""jobs list: the jobs matching a filter, newest first, a page at a time."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any, cast

from .. import _validate as validate
from .._db.queries import queries, transaction
from .._redact import redactor
from ..settings import Settings
from . import _render
from ._common import (
    _command,
    _connect,
    _dsn,
    _job_id,
    _Parser,
    _schema,
    add_filter_options,
    filter_of,
    integer,
    say,
)

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000


def add_jobs(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    jobs = _command(
        sub,
        "jobs",
        [],
        "the jobs matching a filter (see `pgworker jobs list`)",
        "Lists of jobs: `pgworker jobs list` shows those a filter matches, the filter of the "
        "dashboard's list and of GET /jobs.",
        ["pgworker jobs list --status failed --error 'remote down' --finished-after 1h"],
    )
    jobs_sub = cast(
        "argparse._SubParsersAction[_Parser]",
        jobs.add_subparsers(
            dest="jobs_command", required=True, metavar="COMMAND", title="commands"
        ),
    )
    listing = _command(
        jobs_sub,
        "list",
        [common],
        "list the jobs matching a filter, newest first",
        "List the jobs matching the filter options, newest first: id, state, type, queue, "
        "attempts, age, and the first line of the last error (redacted). Every option narrows "
        "the list; with none, every job. At most --limit jobs; when more match, the last line "
        "gives the --before of the next page. --json prints an object with `jobs` (each with "
        "id, status, type, queue, attempts, created_at, finished_at, correlation_id and error) "
        "and `next_before`.",
        [
            "pgworker jobs list --status failed --type send- --finished-after 2h",
            "pgworker jobs list --payload '{\"customer_id\": 42}' --json",
            "pgworker jobs list --error 'remote down' --created-after 2030-01-01T14:02:00+00:00",
        ],
    )
    listing.prog = "pgworker jobs list"
    add_filter_options(listing)
    listing.add_argument(
        "--limit",
        type=integer,
        default=DEFAULT_LIMIT,
        help=f"show at most this many jobs, 1 to {MAX_LIMIT} (default: {DEFAULT_LIMIT})",
    )
    listing.add_argument(
        "--before",
        type=_job_id,
        help="only jobs whose id is below this one: the next page (default: from the newest)",
    )
    listing.add_argument(
        "--json", action="store_true", help="print JSON instead of a table (default: a table)"
    )
    listing.set_defaults(perform=_list)


async def _list(args: argparse.Namespace) -> int:
    job_filter = filter_of(args)
    limit = validate.count("--limit", args.limit, minimum=1, maximum=MAX_LIMIT)
    dsn = _dsn(args)
    keys = redactor(Settings.from_env(dsn=dsn).redact_keys)
    q = queries(_schema(args))
    conn = await _connect(args, dsn)
    try:
        async with transaction(conn) as c:
            await q.plan_with_values(c)
            rows = await q.jobs_filtered(c, job_filter.params(), args.before, limit + 1)
    finally:
        await conn.close()
    more = len(rows) > limit
    jobs = [_job(r, keys) for r in rows[:limit]]
    next_before = jobs[-1]["id"] if more and jobs else None
    if args.json:
        # ASCII: every other character as \uXXXX, which `say` leaves alone (a C1 control kept
        # as itself would be escaped by `say` as \x9b, which is not JSON).
        say(json.dumps({"jobs": jobs, "next_before": next_before}))
        return 0
    say(_text(jobs, next_before))
    return 0


def _job(row: Any, keys: Any) -> dict[str, Any]:
    error = row["error"]
    return {
        "id": row["id"],
        "status": row["status"],
        "type": row["type"],
        "queue": row["queue"],
        "attempts": row["attempts"],
        "created_at": row["created_at"].isoformat(),
        "finished_at": None if row["finished_at"] is None else row["finished_at"].isoformat(),
        "correlation_id": row["correlation_id"],
        "error": None if error is None else keys.text(error),
    }


def _text(jobs: list[dict[str, Any]], next_before: int | None) -> str:
    if not jobs:
        return "(no job matches)"
    now = datetime.now(UTC)
    header = ("id", "state", "type", "queue", "attempts", "age")
    rows = [
        (
            str(j["id"]),
            j["status"],
            j["type"],
            j["queue"],
            str(j["attempts"]),
            _render.age((now - datetime.fromisoformat(j["created_at"])).total_seconds()),
        )
        for j in jobs
    ]
    lines = _render.aligned([header, *rows])
    out = [lines[0]]
    for line, job in zip(lines[1:], jobs, strict=True):
        out.append(line)
        if job["error"]:
            out.append(f"    {_render.one_line(job['error'])}")
    if next_before is not None:
        out.append(f"(more: the next page is --before {next_before})")
    return "\n".join(out)
