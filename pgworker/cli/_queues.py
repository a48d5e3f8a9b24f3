"""status, prune and queue (pause, resume, limit, list): the queues as a whole."""

from __future__ import annotations

import argparse
from typing import cast

from .. import _validate as validate
from .._db.migrations import check_schema
from ..errors import ValidationError
from ..operations import (
    FINISHED,
    MAX_ACTOR_LENGTH,
    MAX_REASON_LENGTH,
    UNCHANGED,
    Unchanged,
    limit_queue,
    list_queues,
    pause_queue,
    prune,
    resume_queue,
    status,
)
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
        f"the last {LIVE_WITHIN:g} seconds, pending types that no live worker serves, and the "
        "queues paused (since when, by whom, why) or limited (their limits): what explains a "
        "backlog. --json adds them as `controls`: objects with the keys queue, paused, "
        "paused_at, paused_by, pause_reason and limits.",
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


def add_queue(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """queue pause, resume, limit and list: the controls every worker obeys."""
    queue = _command(
        sub,
        "queue",
        [],
        "pause, resume, limit and list queues (see `pgworker queue list`)",
        "Controls of a queue as a whole, kept in the database and obeyed by every worker at "
        "once: `pause` stops the claims of a queue's jobs (running ones finish, new ones wait "
        "as pending), `resume` starts them again, `limit` caps its running jobs or its starts "
        "per period across the fleet, `list` shows each queue's state, limits and jobs. Each "
        "pause, resume and limit change is recorded in the operator log (who, when, why).",
        [
            "pgworker queue pause mail --reason 'SMTP provider down'",
            "pgworker queue resume mail",
            "pgworker queue limit mail 5 --rate 600/m",
            "pgworker queue list --json",
        ],
    )
    queue_sub = cast(
        "argparse._SubParsersAction[_Parser]",
        queue.add_subparsers(
            dest="queue_command", required=True, metavar="COMMAND", title="commands"
        ),
    )
    for verb, summary, description, examples in (
        (
            "pause",
            "stop every worker claiming the queue's jobs",
            "Pause QUEUE on every worker: the claims that start once the pause commits take "
            "none of its jobs; its running jobs finish, enqueue still works and its jobs wait "
            "as pending. A queue already paused is left as it is (its first pause's who, when "
            "and why stand) and nothing is logged. A queue that no pending job or worker names "
            "yet is paused all the same (its controls are created, and said so), so that it "
            "can be paused before its first job.",
            [
                "pgworker queue pause mail",
                "pgworker queue pause mail --reason 'SMTP provider down' --by alice",
            ],
        ),
        (
            "resume",
            "let the workers claim the queue's jobs again",
            "Resume a paused QUEUE: every worker serving it is woken when the resume commits "
            "and claims its backlog at once. A queue that is not paused is left as it is and "
            "nothing is logged.",
            ["pgworker queue resume mail", "pgworker queue resume mail --reason 'provider back'"],
        ),
    ):
        command = _command(queue_sub, verb, [common], summary, description, examples)
        command.prog = f"pgworker queue {verb}"
        command.add_argument(
            "queue",
            metavar="QUEUE",
            help=f"the queue, at most {validate.MAX_QUEUE_LENGTH} characters",
        )
        command.add_argument(
            "--reason",
            help=f"why, recorded in the operator log, at most {MAX_REASON_LENGTH} characters "
            "(default: none)",
        )
        command.add_argument(
            "--by", help="who, recorded in the operator log (default: the OS user)"
        )
        command.set_defaults(perform=_pause if verb == "pause" else _resume)
    add_limit(queue_sub, common)
    listing = _command(
        queue_sub,
        "list",
        [common],
        "each queue: paused or not, its limits, its pending and running jobs",
        "Each queue that a job names or that has controls, by name: active or paused (since "
        "when, by whom, why), its limits and its pending and running jobs. --json prints an "
        "array of objects with the keys queue, paused, paused_at, paused_by, pause_reason, "
        "pending, running and limits (an object with max_running and rate, each only when set: "
        "empty when the queue has no limit).",
        ["pgworker queue list", "pgworker queue list --json | jq '.[] | select(.paused)'"],
    )
    listing.prog = "pgworker queue list"
    listing.add_argument(
        "--json",
        action="store_true",
        help="print a JSON array instead of a table (default: a table)",
    )
    listing.set_defaults(perform=_list)


def add_limit(queue_sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    limit = _command(
        queue_sub,
        "limit",
        [common],
        "cap a queue's running jobs or its starts per period, on every worker",
        "Limit QUEUE across the whole fleet: N is the most of its jobs running at once, --rate "
        "the most starts per period (a sliding window). A limit not given stays as it is; "
        "`--rate none` clears the rate only; --none clears every limit of the queue. Kept in "
        "the database, so every worker obeys it at once and it survives restarts; the queue's "
        "workers are woken when it commits. Limits that already are so change nothing and "
        "nothing is logged. A queue that no pending job or worker names yet is limited all the "
        "same (its controls are created, and said so), as pause does.",
        [
            "pgworker queue limit mail 5",
            "pgworker queue limit mail --rate 600/m --reason 'provider allows 10/s'",
            "pgworker queue limit mail --rate none",
            "pgworker queue limit mail --none",
        ],
    )
    limit.prog = "pgworker queue limit"
    limit.add_argument(
        "queue", metavar="QUEUE", help=f"the queue, at most {validate.MAX_QUEUE_LENGTH} characters"
    )
    limit.add_argument(
        "max_running",
        metavar="N",
        nargs="?",
        help=f"the most of its jobs running at once, 1 to {validate.MAX_INT} (default: unchanged)",
    )
    limit.add_argument(
        "--rate",
        help=f"the most starts per period: N/s, N/m, N/h or N/d, N from 1 to "
        f"{validate.MAX_RATE_COUNT}, e.g. 600/m; `none` clears it (default: unchanged)",
    )
    limit.add_argument(
        "--none",
        dest="clear",
        action="store_true",
        help="clear every limit of the queue: no cap on running jobs, no rate (not with N or "
        "--rate)",
    )
    limit.add_argument(
        "--reason",
        help=f"why, recorded in the operator log, at most {MAX_REASON_LENGTH} characters "
        "(default: none)",
    )
    limit.add_argument("--by", help="who, recorded in the operator log (default: the OS user)")
    limit.set_defaults(perform=_limit)


async def _limit(args: argparse.Namespace) -> int:
    # Checked before connecting, named as typed: a bad argument is refused without a database.
    validate.name("QUEUE", args.queue, validate.MAX_QUEUE_LENGTH)
    validate.name("--reason", args.reason, MAX_REASON_LENGTH, required=False)
    validate.name("--by", args.by, MAX_ACTOR_LENGTH, required=False)
    if args.clear:
        if args.max_running is not None or args.rate is not None:
            raise ValidationError("--none", "clears every limit: give it without N or --rate")
        most: int | Unchanged | None = None
        rate: str | Unchanged | None = None
    elif args.max_running is None and args.rate is None:
        raise ValidationError(
            "N", "give N (the most running jobs), --rate R, or --none to clear every limit"
        )
    else:
        most = UNCHANGED if args.max_running is None else _max_running(args.max_running)
        rate = UNCHANGED
        if args.rate is not None:
            none = args.rate.strip().lower() == "none"
            rate = None if none else str(validate.rate("--rate", args.rate))
    conn = await _connect(args)
    try:
        state = await limit_queue(
            conn,
            args.queue,
            max_running=most,
            rate=rate,
            reason=args.reason,
            by=args.by,
            schema=_schema(args),
        )
    finally:
        await conn.close()
    say(_render.queue_limit_text(state, cleared=args.clear))
    return 0


def _max_running(raw: str) -> int:
    """N as typed: ASCII digits, 1 to MAX_INT."""
    problem = f"the most running jobs (max_running) is a whole number from 1 to {validate.MAX_INT}"
    try:
        n = validate.whole(raw)
    except ValueError:
        raise ValidationError("N", f"{problem}, got {raw!r}") from None
    if not 1 <= n <= validate.MAX_INT:
        raise ValidationError("N", f"{problem}, got {raw}")
    return n


async def _pause(args: argparse.Namespace) -> int:
    return await _control(args, "pause")


async def _resume(args: argparse.Namespace) -> int:
    return await _control(args, "resume")


async def _control(args: argparse.Namespace, verb: str) -> int:
    act = pause_queue if verb == "pause" else resume_queue
    # Checked before connecting, named as typed: a bad argument is refused without a database.
    validate.name("QUEUE", args.queue, validate.MAX_QUEUE_LENGTH)
    validate.name("--reason", args.reason, MAX_REASON_LENGTH, required=False)
    validate.name("--by", args.by, MAX_ACTOR_LENGTH, required=False)
    conn = await _connect(args)
    try:
        state = await act(conn, args.queue, args.reason, by=args.by, schema=_schema(args))
    finally:
        await conn.close()
    say(_render.queue_change_text(state, verb))
    return 0


async def _list(args: argparse.Namespace) -> int:
    conn = await _connect(args)
    try:
        found = await list_queues(conn, schema=_schema(args))
    finally:
        await conn.close()
    say(_render.queues_json(found) if args.json else _render.queues_text(found))
    return 0
