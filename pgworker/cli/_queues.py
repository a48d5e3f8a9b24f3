"""status and prune: the queues as a whole."""

from __future__ import annotations

import argparse

from .._db.migrations import check_schema
from ..errors import ValidationError
from ..operations import FINISHED, prune, status
from ..settings import duration
from . import _render
from ._common import _command, _connect, _Parser, _schema, say

LIVE_WITHIN = 60.0


def add_status(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    st = _command(
        sub,
        "status",
        [common],
        "counts per queue and status, live workers",
        "Counts per queue and status, the oldest due pending job's age, the workers seen in "
        f"the last {LIVE_WITHIN:g} seconds, and pending types that no live worker serves.",
        [
            "pgworker status",
            "pgworker status --json | jq '.queues.default.pending'",
        ],
    )
    st.add_argument(
        "--json", action="store_true", help="print JSON instead of a table (default: a table)"
    )
    st.set_defaults(perform=_status)


def add_prune(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    prune = _command(
        sub,
        "prune",
        [common],
        "delete old finished jobs now",
        "Delete finished jobs older than --older-than with their attempts, steps, milestones "
        "and events, in batches of 1,000 (what the elected worker does by itself, see `pgworker "
        "run --retain-completed`). A pruned job's idempotency key is free again.",
        [
            "pgworker prune --older-than 7d",
            "pgworker prune --older-than 30d --status failed --status cancelled --dry-run",
        ],
    )
    prune.add_argument(
        "--older-than",
        required=True,
        help="delete jobs that finished longer ago than this: 30s, 15m, 2h, 7d, 4w (required)",
    )
    prune.add_argument(
        "--status",
        dest="statuses",
        action="append",
        choices=list(FINISHED),
        help="delete jobs of this status; repeat for several (default: completed, failed and "
        "cancelled)",
    )
    prune.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would be deleted, delete nothing (default: delete)",
    )
    prune.set_defaults(perform=_prune)


async def _status(args: argparse.Namespace) -> int:
    conn = await _connect(args)
    try:
        await check_schema(conn, _schema(args))
        found = await status(conn, schema=_schema(args), live_within=LIVE_WITHIN)
    finally:
        await conn.close()
    say(_render.status_json(found) if args.json else _render.status_text(found))
    return 0


async def _prune(args: argparse.Namespace) -> int:
    older_than = duration("--older-than", args.older_than)
    if older_than == 0:
        raise ValidationError("--older-than", "must be more than 0 (1s prunes every finished job)")
    conn = await _connect(args)
    try:
        pruned = await prune(
            conn,
            older_than=older_than,
            statuses=args.statuses or FINISHED,
            dry_run=args.dry_run,
            schema=_schema(args),
        )
    finally:
        await conn.close()
    say(_render.prune_text(pruned, args.dry_run))
    return 0
