"""periodic list: the periodic schedules as the database records them."""

from __future__ import annotations

import argparse
from typing import cast

from .._db.migrations import check_schema
from ..operations import list_periodic
from . import _render
from ._common import _command, _connect, _Parser, _schema, integer, say


def add(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """periodic list: each schedule, its last and next slot, its last job's status."""
    periodic = _command(
        sub,
        "periodic",
        [],
        "the periodic schedules (see `pgworker periodic list`)",
        "The periodic schedules that workers enqueue (`registry.periodic` in the code), as the "
        "database records them: `pgworker periodic list` shows them.",
        ["pgworker periodic list", "pgworker periodic list --json"],
    )
    periodic_sub = cast(
        "argparse._SubParsersAction[_Parser]",
        periodic.add_subparsers(
            dest="periodic_command", required=True, metavar="COMMAND", title="commands"
        ),
    )
    listing = _command(
        periodic_sub,
        "list",
        [common],
        "list the periodic schedules, by name",
        "List the periodic schedules by name, from the database (no application module "
        "needed): the task, when it runs, the last slot enqueued and its job's status, the next "
        "slot, and when a worker defining it last looked at it. A schedule appears once a "
        "worker whose code defines it has started; one removed from the code keeps its row "
        "(its `checked` time grows old). --json prints an array of objects with the keys name, "
        "task, schedule, last_slot, next_slot, last_job_id, last_job_status and checked_at.",
        ["pgworker periodic list", "pgworker periodic list --json | jq '.[].next_slot'"],
    )
    listing.prog = "pgworker periodic list"
    listing.add_argument(
        "--limit",
        type=integer,
        default=1000,
        help="show at most this many schedules, by name (default: 1000)",
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="print a JSON array instead of a table (default: a table)",
    )
    listing.set_defaults(perform=_list)


async def _list(args: argparse.Namespace) -> int:
    conn = await _connect(args)
    try:
        await check_schema(conn, _schema(args))
        found = await list_periodic(conn, limit=args.limit, schema=_schema(args))
    finally:
        await conn.close()
    say(_render.periodic_json(found) if args.json else _render.periodic_text(found))
    return 0
