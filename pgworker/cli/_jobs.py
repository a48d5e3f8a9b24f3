"""enqueue, cancel, show, job update: one job at a time."""

from __future__ import annotations

import argparse
import json
import re
from datetime import datetime
from typing import Any, cast

from .. import _validate as validate
from ..enqueue import enqueue, update_job
from ..errors import PgWorkerError, ValidationError
from ..models import ENQUEUE_OPTIONS, PRIORITY_LABELS, Option
from ..operations import CancelResult, cancel, show_job
from ..settings import Settings
from . import _render
from ._common import (
    _command,
    _connect,
    _dsn,
    _job_id,
    _Parser,
    _schema,
    add_bulk_options,
    add_filter_options,
    integer,
    json_option,
    number,
    refuse_filter_options,
    run_bulk,
    say,
)


def add_enqueue(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    enq = _command(
        sub,
        "enqueue",
        [common],
        "enqueue one job",
        "Enqueue one job and print it as JSON: id, type, queue, status, created (false when "
        "--idempotency-key found an earlier job) and correlation_id.",
        [
            "pgworker enqueue send-invoice --payload '{\"invoice_id\": 42}'",
            "pgworker enqueue send-invoice --priority high --queue mail --max-retries 5",
            "pgworker enqueue report --run-at 2030-01-01T09:00:00+00:00",
            "pgworker enqueue charge --idempotency-key order-42 --correlation-id req-9",
            "pgworker enqueue sync-account --concurrency-key customer-42",
            "pgworker enqueue build-report --after 41 --after 42 --on-parent-failure run",
            "pgworker enqueue refresh-user --unique-key user-7 --replace --delay 30",
        ],
    )
    enq.add_argument(
        "type",
        metavar="TYPE",
        help=f"the job type, a task of the registry, at most {validate.MAX_TYPE_LENGTH} "
        "characters (required)",
    )
    enq.add_argument(
        "--payload",
        default="{}",
        help=f"the payload as JSON, nested at most {validate.MAX_DEPTH} deep (default: {{}})",
    )
    for option in ENQUEUE_OPTIONS.values():
        if option.name not in NOT_FLAGS:
            enq.add_argument(flag_of(option.name), help=flag_help(option), **_reading(option))
    enq.set_defaults(perform=_enqueue)


NOT_FLAGS = {
    "version": "`--version` is the program's version everywhere else; the command line "
    "enqueues payload version 1, as a worker's task of version 1 takes (enqueue another "
    "version from Python or the HTTP API)",
}
"""The enqueue options `pgworker enqueue` has no flag for, each with its reason."""


def _reading(option: Option) -> dict[str, Any]:
    """How an option of its kind (models.OptionKind) is read from the command line."""
    match option.kind:
        case "int":
            return {"type": integer}
        case "priority":
            return {"type": _priority}
        case "seconds":
            return {"type": number}
        case "ids":
            return {"type": _job_id, "action": "append", "metavar": "ID"}
        case "choice":
            return {"choices": option.choices}
        case "states":
            return {"type": _states}
        case "flag":
            return {"action": "store_true"}
        case _:  # text, and a time (read by _moment, naming the flag)
            return {}


def flag_of(name: str) -> str:
    """An option's flag: `--run-at` for run_at."""
    return "--" + name.replace("_", "-")


def flag_help(option: Option) -> str:
    """An option's help, the options it names written as flags."""
    text = re.sub(r"`([a-z_]+)`", lambda m: flag_of(m[1]), option.help)
    if option.kind == "ids":
        text = text.replace(" (default:", f"; repeat {flag_of(option.name)} for each (default:")
    if option.kind == "states":
        text = text.replace("; ", ", comma-separated; ", 1)
    return text


def add_cancel(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    can = _command(
        sub,
        "cancel",
        [common],
        "cancel a job",
        "Cancel a pending job, or ask the worker of a running job to stop it; a finished job "
        "is left as it is. Prints what happened. With --filter, every pending or running job "
        "the filter options match, in batches, after a confirmation stating their count.",
        [
            "pgworker cancel 42",
            "pgworker cancel 42 --schema jobs",
            "pgworker cancel --filter --status pending --type report- --yes",
        ],
    )
    can.add_argument(
        "job_id",
        metavar="ID",
        type=_job_id,
        nargs="?",
        help="the job's id; with --filter, none (required)",
    )
    add_bulk_options(can)
    add_filter_options(can)
    can.add_argument(
        "--by", help="with --filter: who cancels, recorded with each job (default: the OS user)"
    )
    can.add_argument(
        "--reason",
        help="with --filter: why, kept with the bulk action, each job's event and the operator "
        "log (default: none)",
    )
    can.set_defaults(perform=_cancel)


def add_show(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    show = _command(
        sub,
        "show",
        [common],
        "one job in full: milestones, steps, attempts",
        "Show one job: its fields and payload (the values of sensitive keys, PGWORKER_REDACT_KEYS, "
        "replaced by [REDACTED]), its milestones, its steps, every attempt with its outcome, "
        "worker, times and error, and its replays.",
        [
            "pgworker show 42",
            "pgworker show 42 --json | jq '.attempts[-1].error_detail'",
        ],
    )
    show.add_argument("job_id", metavar="ID", type=_job_id, help="the job's id (required)")
    show.add_argument(
        "--json", action="store_true", help="print JSON instead of text (default: text)"
    )
    show.set_defaults(perform=_show)


def _states(raw: str) -> list[str]:
    """--unique-states: comma-separated states (checked by enqueue)."""
    return [s.strip() for s in raw.split(",")]


def add_job(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """job update: change a pending job."""
    job = _command(
        sub,
        "job",
        [],
        "change a pending job (see `pgworker job update`)",
        "Commands on one job that change it: `update` reschedules, reprioritises or gives a new "
        "payload to a job still pending.",
        ["pgworker job update 42 --run-at 2030-01-01T09:00:00+00:00 --priority high"],
    )
    job_sub = cast(
        "argparse._SubParsersAction[_Parser]",
        job.add_subparsers(dest="job_command", required=True, metavar="COMMAND", title="commands"),
    )
    update = _command(
        job_sub,
        "update",
        [common],
        "reschedule, reprioritise or change the payload of a pending job",
        "Change a job still pending (at least one of --run-at, --priority, --payload) and print "
        "it as JSON: id, status, run_at, priority. Refused, with nothing changed, once the job "
        "runs or ended, and for --run-at on a parked job (one waiting for its parents or an "
        "event). Recorded in the job's events (who, what changed).",
        [
            "pgworker job update 42 --run-at 2030-01-01T09:00:00+00:00",
            "pgworker job update 42 --priority critical",
            "pgworker job update 42 --payload '{\"user\": 7}' --by alice",
        ],
    )
    update.add_argument("job_id", metavar="ID", type=_job_id, help="the job's id (required)")
    update.add_argument(
        "--run-at",
        help="run no sooner than this ISO 8601 time with a timezone, e.g. "
        "2030-01-01T09:00:00+00:00 (default: unchanged)",
    )
    update.add_argument(
        "--priority",
        type=_priority,
        help=f"an int or one of {', '.join(PRIORITY_LABELS)} (default: unchanged)",
    )
    update.add_argument("--payload", help="the new payload as JSON (default: unchanged)")
    update.add_argument("--by", help="who changes it (default: the OS user)")
    update.set_defaults(perform=_update)


def _moment(flag: str, raw: str | None) -> datetime | None:
    """An ISO 8601 time with a time zone given to `flag`, or None."""
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise PgWorkerError(f"{flag} {raw!r} is not an ISO 8601 time") from exc
    if moment.tzinfo is None:
        raise ValidationError(flag, f"{raw!r} has no time zone; add one, e.g. {raw}+00:00")
    return moment


async def _update(args: argparse.Namespace) -> int:
    run_at = _moment("--run-at", args.run_at)
    payload = None if args.payload is None else json_option("--payload", args.payload)
    conn = await _connect(args)
    try:
        job = await update_job(
            conn,
            args.job_id,
            run_at=run_at,
            priority=args.priority,
            payload=payload,
            by=args.by,
            schema=_schema(args),
        )
    finally:
        await conn.close()
    say(
        json.dumps(
            {
                "id": job.id,
                "status": job.status.value,
                "run_at": job.run_at.isoformat(),
                "priority": job.priority,
            }
        )
    )
    return 0


def _priority(raw: str) -> int:
    """--priority: an int, or a label validate.priority knows."""
    value: int | str
    try:
        value = validate.whole(raw)
    except ValueError:
        value = raw
    try:
        return validate.priority("priority", value)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("priority: ")) from None


async def _enqueue(args: argparse.Namespace) -> int:
    payload = json_option("--payload", args.payload)
    options: dict[str, Any] = {
        name: getattr(args, name) for name in ENQUEUE_OPTIONS if name not in NOT_FLAGS
    }
    options["run_at"] = _moment("--run-at", args.run_at)
    if options["run_at"] is not None and args.delay is not None:
        raise ValidationError("--run-at", "give --run-at or --delay, not both")
    conn = await _connect(args)
    try:
        result = await enqueue(conn, args.type, payload, schema=_schema(args), **options)
    finally:
        await conn.close()
    job = result.job
    say(
        json.dumps(
            {
                "id": job.id,
                "type": job.type,
                "queue": job.queue,
                "status": job.status.value,
                "created": result.created,
                "correlation_id": job.correlation_id,
            }
        )
    )
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    if args.filter:
        if args.job_id is not None:
            raise ValidationError("--filter", "goes with the filter options, not with an id")
        return await run_bulk(args, "cancel")
    refuse_filter_options(args)
    if args.job_id is None:
        raise ValidationError("ID", "give the id of the job to cancel, or --filter")
    for given, flag in ((args.reason, "--reason"), (args.by, "--by")):
        if given is not None:
            raise ValidationError(flag, "goes with --filter: one job's cancel records neither")
    conn = await _connect(args)
    try:
        outcome = await cancel(conn, args.job_id, schema=_schema(args))
    finally:
        await conn.close()
    match outcome:
        case CancelResult.CANCELLED:
            say(f"job {args.job_id} cancelled (it was pending)")
        case CancelResult.CANCELLING:
            say(f"job {args.job_id} is running: its worker was asked to stop it")
        case _:  # CancelResult.ALREADY_COMPLETED, ALREADY_FAILED, ALREADY_CANCELLED
            say(f"job {args.job_id} is {outcome.value}: nothing to cancel")
    return 0


async def _show(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    keys = Settings.from_env(dsn=dsn).redact_keys
    conn = await _connect(args, dsn)
    try:
        found = await show_job(conn, args.job_id, redact_keys=keys, schema=_schema(args))
    finally:
        await conn.close()
    if found is None:
        raise ValidationError("ID", f"there is no job {args.job_id}")
    say(_render.show_json(found) if args.json else _render.show_text(found))
    return 0
