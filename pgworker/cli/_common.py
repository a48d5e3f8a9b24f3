"""What every command shares: `say` (the only way the CLI prints), the parser that turns a
mistake into one line and exit status 2, the options' types, the DSN and schema every command
but health resolves the same way, and the loading of a user's registry."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import asyncpg

from .. import _bulk as bulk
from .. import _terminal
from .. import _validate as validate
from .._db.connection import connect, pooler_refusal
from .._filters import FIELDS as FILTER_FIELDS
from .._filters import JobFilter
from .._redact import describe
from ..errors import ConfigError, PgWorkerError, ValidationError
from ..models import DEFAULT_SCHEMA
from ..operations import MAX_ACTOR_LENGTH, MAX_REASON_LENGTH
from ..registry import Registry, load
from ..settings import SETTINGS, Setting, dsn_from_env, flag, retention, variable


def say(text: str, *, err: bool = False, end: str = "\n") -> None:
    """Print one message (lines joined by newlines) on stdout, or stderr: the only way the CLI
    prints. Text from the database is anybody's, so every control character in it (ESC, CR, C1,
    bidi overrides: see `_terminal.terminal`) is shown escaped, never obeyed by the terminal.
    `end=""` leaves the cursor on the line (a question), flushed at once."""
    print(_terminal.terminal(text), file=sys.stderr if err else sys.stdout, end=end, flush=not end)


class _Parser(argparse.ArgumentParser):
    """A mistake in the arguments is one line on stderr and exit status 2, as any other."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: error: {message} (see --help)", err=True)
        self.exit(2)


def integer(raw: str) -> int:
    return validate.whole(raw)


def number(raw: str) -> float:
    return validate.real(raw)


def _job_id(raw: str) -> int:
    try:
        return validate.count("ID", validate.whole(raw), minimum=1, maximum=validate.MAX_BIGINT)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a job id is a whole number from 1 to {validate.MAX_BIGINT}, got {raw!r}"
        ) from None


def _schema_name(raw: str) -> str:
    try:
        return validate.identifier("--schema", raw)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--schema: ")) from None


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _command(
    sub: argparse._SubParsersAction[_Parser],
    name: str,
    parents: list[_Parser],
    summary: str,
    description: str,
    examples: Sequence[str],
) -> argparse.ArgumentParser:
    """A subcommand: `summary` is its line in `pgworker --help`, `examples` its epilog."""
    return sub.add_parser(
        name,
        parents=parents,
        help=summary,
        description=textwrap.fill(description, 79),
        epilog=_examples(*examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def common_options() -> _Parser:
    """--dsn, --schema and --pooler, the parent of every command but health and failed."""
    common = _Parser(add_help=False)
    for name, setting in SETTINGS.items():
        if setting.common:
            add_setting(common, name)
    return common


def add_setting(parser: argparse.ArgumentParser, name: str) -> None:
    """The flag of worker setting `name`, as settings.Settings declares it."""
    setting = SETTINGS[name]
    parser.add_argument(
        setting.flag or "--" + name.replace("_", "-"),
        dest=name,
        help=_setting_help(name, setting),
        **_setting_reading(name, setting),
    )


def _setting_help(name: str, setting: Setting) -> str:
    """A setting's help on the command line: what it does, and its default, its variable's
    first."""
    said = f"${variable(name)}"
    if setting.kind == "flag":
        turned = "off" if setting.default == "on" else "on"
        return (
            f"{setting.flag_help or setting.help} (default: {setting.default}; "
            f"{said}={str(turned == 'on').lower()} turns it {turned} too)"
        )
    if setting.kind == "names":
        said = f"{said}, comma-separated"
    return f"{setting.help} (default: {said}, else {setting.default})"


def _setting_reading(name: str, setting: Setting) -> dict[str, Any]:
    """How a setting of its kind (settings.SettingKind) is read from the command line."""
    match setting.kind:
        case "int":
            return {"type": integer}
        case "seconds":
            return {"type": number}
        case _ if name == "schema":
            return {"type": _schema_name}
        case "retention":
            return {"type": _retention}
        case "names":
            return {"action": "append"}
        case "flag":  # given: on, or off for a --no- flag; not given: the variable's, or default
            return {"action": "store_const", "const": not (setting.flag or "").startswith("--no-")}
        case _:
            return {"metavar": setting.metavar} if setting.metavar else {}


def _retention(raw: str) -> float:
    """--retain-completed, --retain-failed: a duration, or 0 / none (0: Settings keeps forever)."""
    try:
        return retention("retention", raw, error=ValidationError) or 0.0
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("retention: ")) from None


def _pooler(args: argparse.Namespace) -> bool:
    """--pooler, else PGWORKER_POOLER."""
    if getattr(args, "pooler", None):
        return True
    return flag("pooler", os.environ.get("PGWORKER_POOLER", ""))


async def _connect(args: argparse.Namespace, dsn: str | None = None) -> asyncpg.Connection:
    """A connection for one command, to `dsn` (default: --dsn, PGWORKER_DSN, DATABASE_URL), in
    pooler mode if asked for."""
    return await connect(dsn or _dsn(args), pooler=_pooler(args))


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or dsn_from_env()
    if not dsn:
        raise PgWorkerError("no database given; pass --dsn or set PGWORKER_DSN or DATABASE_URL")
    return dsn


LOG_FORMATS = ["json", "console"]


def _from_env(name: str, choices: list[str], default: str) -> str:
    """An option's environment variable, one of `choices`, else `default`."""
    value = os.environ.get(name) or default
    if value not in choices:
        raise ConfigError(name, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def _schema(args: argparse.Namespace) -> str:
    if args.schema:
        return str(args.schema)
    found = os.environ.get("PGWORKER_SCHEMA") or DEFAULT_SCHEMA
    return validate.identifier("PGWORKER_SCHEMA", found, error=ConfigError)


def _user_error(exc: BaseException) -> PgWorkerError | None:
    """The PgWorkerError behind `exc`, looking through task groups' exception groups; what a
    transaction pooler does to a command not in pooler mode is one too."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    # Before pgworker's own: enqueue's advice on the same refusal is for a service's own pool.
    for seen in (exc, exc.__cause__):
        pooler = None if seen is None else pooler_refusal(seen)
        if pooler is not None:
            return pooler
    return exc if isinstance(exc, PgWorkerError) else None


def _refusal(exc: BaseException) -> str | None:
    """What the server said when it refused a statement (read-only, a privilege, a trigger of
    the user's own), as one line."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if not isinstance(exc, asyncpg.PostgresError):
        return None
    return describe(exc).replace("\n", " ")


def _name(args: argparse.Namespace) -> str:
    """The command as typed: `failed list`, `periodic list` and `queue pause` have a
    subcommand."""
    sub = (
        getattr(args, "failed_command", None)
        or getattr(args, "periodic_command", None)
        or getattr(args, "queue_command", None)
        or getattr(args, "job_command", None)
    )
    return f"{args.command} {sub}" if sub else str(args.command)


def _load(target: str) -> Registry:
    """The registry of `target`. A module that raises when imported gets its own traceback
    printed (without pgworker's and importlib's frames), then one line."""
    try:
        return load(target)
    except PgWorkerError:
        raise
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and _not_users(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        shown = traceback.format_exception(type(exc), exc, tb or exc.__traceback__)
        say("".join(shown).rstrip("\n"), err=True)
        module = target.partition(":")[0]
        raise ConfigError(
            "module", f"importing {module!r} raised {type(exc).__name__}: {exc}"
        ) from None


def _not_users(filename: str) -> bool:
    return filename.startswith(_PACKAGE) or "importlib" in filename


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def json_option(flag: str, raw: str) -> object:
    """An option's JSON value (`--payload`, `--data`): bad JSON is a usage error naming `flag`,
    too deep a ValidationError naming its field."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValidationError(
            flag.removeprefix("--"),
            f"must not nest lists and objects more than {validate.MAX_DEPTH} deep",
        ) from None
    except ValueError as exc:
        raise PgWorkerError(f"{flag} is not valid JSON: {exc}") from None


# --- the job lists' filter, and bulk actions over it ----------------------------------

_FILTER_HELP = {
    "status": "only jobs in this state: pending, running, completed, failed or cancelled",
    "queue": "only jobs of this queue",
    "type": "only jobs whose type starts with this text (send matches send-invoice)",
    "error": "only jobs whose last error holds this text, in any letter case",
    "created_after": "only jobs created at or after this ISO 8601 time with a time zone, or "
    "this long ago (15m, 2h, 7d)",
    "created_before": "only jobs created before this time (as --created-after)",
    "finished_after": "only jobs finished at or after this time (as --created-after)",
    "finished_before": "only jobs finished before this time (as --created-after)",
    "correlation_id": "only jobs of this correlation id",
    "id": "only the job of this id",
    "payload": "only jobs whose payload contains this JSON object, e.g. '{\"customer_id\": 42}'",
    "ids": "only the jobs of these ids, separated by commas (at most 1,000), e.g. 12,15,40",
    "error_group": "only jobs whose latest error is of this failure group (its fingerprint, "
    "from `pgworker failed groups`)",
}


def add_filter_options(parser: argparse.ArgumentParser, *, skip: Sequence[str] = ()) -> None:
    """The filter of the job lists as options (--status, --queue, --type, --error,
    --created-after, ..., --payload): those of `pgworker jobs list`, `replay --filter` and
    `cancel --filter`. `skip` leaves out the ones the command already has (replay's --type and
    --queue)."""
    for field in FILTER_FIELDS:
        if field in skip:
            continue
        parser.add_argument(
            f"--{field.replace('_', '-')}",
            dest=f"filter_{field}",
            metavar=field.upper().replace("_", "-") if field != "payload" else "JSON",
            help=f"{_FILTER_HELP[field]} (default: any)",
        )


def filter_of(args: argparse.Namespace) -> JobFilter:
    """The filter the options give (replay's --type and --queue read as the filter's)."""
    values = {}
    for field in FILTER_FIELDS:
        value = getattr(args, f"filter_{field}", None)
        if value is None and field in ("type", "queue"):
            value = getattr(args, field, None)
        if value is not None:
            values[field] = value
    try:
        return JobFilter.parse(values)
    except ValidationError as exc:
        reason = str(exc).removeprefix(f"{exc.field}: ")
        raise ValidationError(f"--{exc.field.replace('_', '-')}", reason) from None


def refuse_filter_options(args: argparse.Namespace) -> None:
    """A filter option given without --filter is a mistake, said, never silently ignored."""
    for field in FILTER_FIELDS:
        if getattr(args, f"filter_{field}", None) is not None:
            raise ValidationError(f"--{field.replace('_', '-')}", "goes with --filter")
    for option in ("yes", "resume", "batch_size"):
        if getattr(args, option, None) not in (None, False):
            raise ValidationError(f"--{option.replace('_', '-')}", "goes with --filter")


_VERBS = {"replay": "replayed", "cancel": "cancelled", "delete": "deleted", "reschedule": "moved"}


async def run_bulk(args: argparse.Namespace, kind: str) -> int:
    """`replay --filter` and `cancel --filter`: count the matching jobs, ask for confirmation
    with the count (unless --yes), then run the action's batches here, printing its progress on
    stderr. The action is recorded (`bulk_actions`): killed midway, it is adopted once its lease
    lapses by a console, `pgworker serve` or the workers' maintenance leader, or resumed by
    `--resume ID`."""
    job_filter = filter_of(args)
    # Checked before connecting, named as typed: a bad argument is refused without a database.
    validate.name("--reason", args.reason, MAX_REASON_LENGTH, required=False)
    validate.name("--by", args.by, MAX_ACTOR_LENGTH, required=False)
    schema = _schema(args)
    batch = getattr(args, "batch_size", None)
    conn = await _connect(args)
    holder = bulk.Holder.of("cli")  # killed midway, its action is adopted once its lease lapses
    try:
        resume = getattr(args, "resume", None)
        if resume is not None:
            found = await bulk.get(conn, resume, schema=schema)
            if found is None or found.kind != kind:
                raise ValidationError("--resume", f"there is no {kind} action {resume}")
            action = found
        else:
            bound, matched = await bulk.count(conn, job_filter, schema=schema)
            if matched == 0:
                say(f"no job matches ({job_filter.words()}): nothing to {kind}")
                return 0
            if not args.yes and not _confirmed(
                f"{kind} {matched:,} jobs matching {job_filter.words()}? [y/N] "
            ):
                say(f"nothing done: {kind} not confirmed", err=True)
                return 1
            action = await bulk.create(
                conn,
                kind,
                job_filter,
                by=args.by,
                reason=args.reason,
                max_id=bound,
                holder=holder,
                schema=schema,
            )
        say(f"bulk action {action.id}: {kind} of {action.matched:,} jobs", err=True)

        def progress(found: bulk.BulkAction) -> None:
            say(f"  {found.done + found.skipped:,} of {found.matched:,} handled", err=True)

        done = await bulk.run(
            conn, action.id, batch=batch, progress=progress, holder=holder, schema=schema
        )
    finally:
        await conn.close()
    verb = _VERBS[kind]
    say(
        f"bulk action {done.id} {done.state}: {done.done:,} jobs {verb}, {done.skipped:,} left "
        "as they were (their state did not allow it)"
    )
    if done.state == "failed":
        say(f"bulk action {done.id} failed: {done.error}", err=True)
        return 1
    return 0


def _confirmed(question: str) -> bool:
    """A yes from the terminal; without one (stdin is not a terminal), no."""
    if not sys.stdin.isatty():
        raise ValidationError("--yes", "stdin is not a terminal: pass --yes to confirm")
    say(question, err=True, end="")
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def add_bulk_options(parser: argparse.ArgumentParser) -> None:
    """--filter, --yes, --batch-size and --resume of replay and cancel."""
    parser.add_argument(
        "--filter",
        action="store_true",
        help="act on every job the filter options match (--status, --type, --queue, --error, "
        "--created-after, ..., --payload, as `pgworker jobs list` takes them), in batches, "
        "asking for confirmation with the count (default: by id)",
    )
    parser.add_argument(
        "--yes",
        action="store_true",
        help="with --filter: do not ask for confirmation (default: ask)",
    )
    parser.add_argument(
        "--batch-size",
        type=_batch,
        help="with --filter: jobs per batch and transaction (default: $PGWORKER_BULK_BATCH, "
        f"else {bulk.BATCH})",
    )
    parser.add_argument(
        "--resume",
        metavar="ACTION",
        type=_job_id,
        help="with --filter: go on with the bulk action ACTION, left unfinished (default: none)",
    )


def _batch(raw: str) -> int:
    try:
        return validate.count(
            "--batch-size", validate.whole(raw), minimum=1, maximum=bulk.MAX_BATCH
        )
    except (ValueError, ValidationError):
        raise argparse.ArgumentTypeError(
            f"a batch size is a whole number from 1 to {bulk.MAX_BATCH}, got {raw!r}"
        ) from None
