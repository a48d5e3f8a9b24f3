"""failed list and replay: the dead-letter set, and running its jobs again on purpose."""

from __future__ import annotations

import argparse
from typing import cast

from .. import _validate as validate
from .._logs import LogFormat, configure_logging
from ..errors import ValidationError
from ..operations import (
    FAILURE_STATUSES,
    MAX_FAILURE_GROUPS,
    failure_groups,
    list_failed,
    replay,
    since_moment,
)
from . import _render
from ._common import (
    LOG_FORMATS,
    _command,
    _connect,
    _from_env,
    _job_id,
    _Parser,
    _schema,
    add_bulk_options,
    add_filter_options,
    integer,
    refuse_filter_options,
    run_bulk,
    say,
)

SINCE_HELP = (
    "only jobs that failed within this duration (30s, 15m, 2h, 7d, 1w, or seconds) or since "
    "this ISO 8601 time with a time zone (default: any time)"
)


def add_failed(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """failed list: the failed jobs, newest failure first; failed groups: the failures grouped
    by cause."""
    failed = _command(
        sub,
        "failed",
        [],
        "the failed jobs (see `pgworker failed list`)",
        "The failed jobs, kept apart for diagnosis: `pgworker failed list` shows them, "
        "`pgworker failed groups` the failures grouped by cause, `pgworker show ID` one in "
        "full, `pgworker replay` runs them again.",
        [
            "pgworker failed list",
            "pgworker failed list --type send-invoice --since 2h --json",
            "pgworker failed groups --since 7d",
        ],
    )
    failed_sub = cast(
        "argparse._SubParsersAction[_Parser]",
        failed.add_subparsers(
            dest="failed_command", required=True, metavar="COMMAND", title="commands"
        ),
    )
    listing = _command(
        failed_sub,
        "list",
        [common],
        "list the failed jobs, newest failure first",
        "List the failed jobs, newest failure first: id, type, queue, correlation id, attempts, "
        "the first and last attempts' start times, and the first line of the error. --json "
        "prints an array of objects with the keys id, type, queue, correlation_id, attempts, "
        "first_attempt_at, last_attempt_at and error.",
        [
            "pgworker failed list",
            "pgworker failed list --type send-invoice --queue mail --since 2h",
            "pgworker failed list --since 2030-01-01T00:00:00+00:00 --limit 1000 --json",
        ],
    )
    listing.prog = "pgworker failed list"
    listing.add_argument("--type", help="only jobs of this type (default: every type)")
    listing.add_argument("--queue", help="only jobs of this queue (default: every queue)")
    listing.add_argument("--since", help=SINCE_HELP)
    listing.add_argument(
        "--limit",
        type=integer,
        default=100,
        help="show at most this many jobs, the newest failures (default: 100)",
    )
    listing.add_argument(
        "--json",
        action="store_true",
        help="print a JSON array instead of a table (default: a table)",
    )
    listing.set_defaults(perform=_failed)
    grouping = _command(
        failed_sub,
        "groups",
        [common],
        "the failures grouped by cause, the largest groups first",
        "The failures grouped as people think of them: by job type, exception class, the "
        "message with its values set aside (ids, numbers, UUIDs, hex, quoted values, URLs, "
        "e-mail addresses, paths) and the innermost frame of its traceback. Each group: its "
        "fingerprint (`pgworker jobs list --error-group FINGERPRINT` lists its jobs, `pgworker "
        "replay --filter --error-group FINGERPRINT` replays them), how many, the type, the "
        "error class, the first and last time one ended, a line per hour of the last 24, and "
        "the newest one's error. --status failed (the default) groups the jobs that ended "
        "failed, --status retrying the failed attempts of the jobs still being retried. --json "
        "prints an array of objects with the keys fingerprint, type, error_class, count, "
        "first_seen, last_seen, sample and trend (24 counts, oldest hour first), as GET "
        "/failures answers.",
        [
            "pgworker failed groups",
            "pgworker failed groups --status retrying --type send- --since 2h",
            "pgworker failed groups --since 7d --json",
        ],
    )
    grouping.prog = "pgworker failed groups"
    grouping.add_argument(
        "--status",
        default="failed",
        help="failed: the jobs that ended failed; retrying: the failed attempts of the jobs "
        "still pending or running (default: failed)",
    )
    grouping.add_argument(
        "--type", help="only jobs whose type starts with this text (default: every type)"
    )
    grouping.add_argument("--queue", help="only jobs of this queue (default: every queue)")
    grouping.add_argument(
        "--since",
        help="only failures within this duration (30s, 15m, 2h, 7d, 1w, or seconds) or since "
        "this ISO 8601 time with a time zone (default: 24h)",
    )
    grouping.add_argument(
        "--limit",
        type=integer,
        default=50,
        help="show at most this many groups, the largest (default: 50)",
    )
    grouping.add_argument(
        "--json",
        action="store_true",
        help="print a JSON array instead of a table (default: a table)",
    )
    grouping.set_defaults(perform=_groups)


def add_replay(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    rep = _command(
        sub,
        "replay",
        [common],
        "run failed jobs again, on purpose",
        "Put failed (or, by id, cancelled) jobs back to pending now, with their retries and "
        "retry-time budget afresh, their error cleared; their attempts number on. By ID, or "
        "every failed job of --type (cancelled jobs were stopped on purpose: replay those by "
        "id). Each replay is recorded (--by, --reason) and logged. A job that is not failed or "
        "cancelled is left as it is, said on stderr, and the exit status is 1.",
        [
            "pgworker replay 42 43 --reason 'mail service back'",
            "pgworker replay --type send-invoice --since 2h --dry-run",
            "pgworker replay --type send-invoice --queue mail --by alice --reason 'fix #123'",
            "pgworker replay --filter --status failed --error 'remote down' --finished-after 1h",
        ],
    )
    rep.add_argument(
        "ids",
        metavar="ID",
        type=_job_id,
        nargs="*",
        help="the jobs to replay (required, unless --type or --filter is given)",
    )
    rep.add_argument(
        "--type", help="replay every failed job of this type (default: none; not with IDs)"
    )
    rep.add_argument("--queue", help="with --type: only jobs of this queue (default: every queue)")
    rep.add_argument("--since", help="with --type: " + SINCE_HELP)
    rep.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be replayed, change nothing (default: replay)",
    )
    rep.add_argument("--by", help="who replays, recorded with each replay (default: the OS user)")
    rep.add_argument("--reason", help="why, recorded with each replay (default: none)")
    add_bulk_options(rep)
    add_filter_options(rep, skip=("type", "queue"))
    rep.set_defaults(perform=_replay)


async def _groups(args: argparse.Namespace) -> int:
    """`failed groups`."""
    since = since_moment("--since", args.since)
    limit = validate.count("--limit", args.limit, minimum=1, maximum=MAX_FAILURE_GROUPS)
    if args.status not in FAILURE_STATUSES:
        raise ValidationError(
            "--status", f"must be one of {', '.join(FAILURE_STATUSES)}, got {args.status!r}"
        )
    conn = await _connect(args)
    try:
        found = await failure_groups(
            conn,
            status=args.status,
            type=args.type,
            queue=args.queue,
            since=since,
            limit=limit,
            schema=_schema(args),
        )
    finally:
        await conn.close()
    say(_render.groups_json(found) if args.json else _render.groups_text(found))
    return 0


async def _failed(args: argparse.Namespace) -> int:
    """`failed list`."""
    since = since_moment("--since", args.since)
    limit = validate.count("--limit", args.limit, minimum=1)
    conn = await _connect(args)
    try:
        found = await list_failed(
            conn, type=args.type, queue=args.queue, since=since, limit=limit, schema=_schema(args)
        )
    finally:
        await conn.close()
    say(_render.failed_json(found) if args.json else _render.failed_text(found))
    return 0


async def _replay(args: argparse.Namespace) -> int:
    if args.filter:
        # Every failed or cancelled job the filter matches (with --filter, --type is a prefix,
        # as in `pgworker jobs list`), in batches: a bulk action.
        if args.ids or args.since is not None or args.dry_run:
            raise ValidationError(
                "--filter", "goes with the filter options, not with ids, --since or --dry-run"
            )
        configure_logging(
            cast(LogFormat, _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")), "warning"
        )
        return await run_bulk(args, "replay")
    refuse_filter_options(args)
    if args.ids and args.type is not None:
        raise ValidationError("ID", "give job ids or --type, not both")
    if not args.ids and args.type is None:
        raise ValidationError("ID", "give the ids of the jobs to replay, or --type")
    if args.ids and (args.since is not None or args.queue is not None):
        raise ValidationError("--since", "--since and --queue go with --type, not with ids")
    since = since_moment("--since", args.since)
    configure_logging(
        cast(LogFormat, _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")), "info"
    )
    conn = await _connect(args)
    try:
        selection = {"type": args.type, "since": since, "queue": args.queue}
        result = await replay(
            conn,
            args.ids or None,
            by=args.by,
            reason=args.reason,
            dry_run=args.dry_run,
            schema=_schema(args),
            **selection,
        )
    finally:
        await conn.close()
    say(_render.replay_text(result))
    for line in _render.skipped_lines(result):
        say(f"pgworker replay: {line}", err=True)
    return 1 if result.skipped else 0
