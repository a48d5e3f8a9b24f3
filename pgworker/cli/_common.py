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
from typing import NoReturn

import asyncpg

from .. import _limits as limits
from .. import _terminal
from .._db.connection import connect, pooler_refusal
from .._redact import describe
from ..errors import ConfigError, PgWorkerError, ValidationError
from ..models import DEFAULT_SCHEMA
from ..registry import Registry, load
from ..settings import dsn_from_env, flag


def say(text: str, *, err: bool = False) -> None:
    """Print one message (lines joined by newlines) on stdout, or stderr: the only way the CLI
    prints. Text from the database is anybody's, so every control character in it (ESC, CR, C1,
    bidi overrides: see `_terminal.terminal`) is shown escaped, never obeyed by the terminal."""
    print(_terminal.terminal(text), file=sys.stderr if err else sys.stdout)


class _Parser(argparse.ArgumentParser):
    """A mistake in the arguments is one line on stderr and exit status 2, as any other."""

    def error(self, message: str) -> NoReturn:
        say(f"{self.prog}: error: {message} (see --help)", err=True)
        self.exit(2)


def integer(raw: str) -> int:
    return limits.whole(raw)


def number(raw: str) -> float:
    return limits.real(raw)


def _job_id(raw: str) -> int:
    try:
        return limits.count("ID", limits.whole(raw), minimum=1, maximum=limits.MAX_BIGINT)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a job id is a whole number from 1 to {limits.MAX_BIGINT}, got {raw!r}"
        ) from None


def _schema_name(raw: str) -> str:
    try:
        return limits.identifier("--schema", raw)
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
    common.add_argument(
        "--dsn",
        help="the PostgreSQL connection URL, e.g. postgresql://app@db:5432/app (default: "
        "$PGWORKER_DSN, else $DATABASE_URL; required if neither is set)",
    )
    common.add_argument(
        "--schema",
        type=_schema_name,
        help=f"pgworker's schema, a plain SQL identifier (default: $PGWORKER_SCHEMA, else "
        f"{DEFAULT_SCHEMA})",
    )
    common.add_argument(
        "--pooler",
        action="store_const",
        const=True,
        help="the DSN reaches PostgreSQL through a transaction pooler such as PgBouncer: no "
        "startup parameters, prepared statements or session locks (default: "
        "$PGWORKER_POOLER=true, else off)",
    )
    return common


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
    return limits.identifier("PGWORKER_SCHEMA", found, error=ConfigError)


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
            f"must not nest lists and objects more than {limits.MAX_DEPTH} deep",
        ) from None
    except ValueError as exc:
        raise PgWorkerError(f"{flag} is not valid JSON: {exc}") from None
