"""emit: an event for the jobs waiting in `ctx.wait_for_event` (docs/guide/events.md)."""

from __future__ import annotations

import argparse
import json

from .. import _validate as validate
from .._events import emit
from ._common import _command, _connect, _Parser, _schema, json_option, say


def add_emit(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    cmd = _command(
        sub,
        "emit",
        [common],
        "emit an event for the jobs waiting for it",
        "Emit an event: every job waiting for NAME in ctx.wait_for_event gets DATA and runs "
        "again at once; the event is kept for waits that come later (each job consumes an event "
        "once). Prints how many waiting jobs it woke, as JSON.",
        [
            "pgworker emit approval:order-42 --data '{\"approved\": true}'",
            "pgworker emit deploy-finished",
        ],
    )
    cmd.add_argument("name", metavar="NAME", help="the event's name (required, 1-200 characters)")
    cmd.add_argument(
        "--data", metavar="JSON", default=None, help="the event's data as JSON (default: none)"
    )
    cmd.set_defaults(perform=_emit)


async def _emit(args: argparse.Namespace) -> int:
    data = None if args.data is None else json_option("--data", args.data)
    name = validate.event_name(args.name)
    conn = await _connect(args)
    try:
        woken = await emit(conn, name, data, schema=_schema(args))
    finally:
        await conn.close()
    say(json.dumps({"name": name, "woken": woken}))
    return 0
