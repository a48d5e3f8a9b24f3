"""The parser assembled from each command's module, and `main`, the console script. Each
command's `add` registers its subcommand with its arguments and, as the default `perform`, the
coroutine that `main` runs for it."""

from __future__ import annotations

import argparse
import signal
import textwrap
import traceback
from collections.abc import Awaitable, Callable, Sequence

import anyio

from .._version import __version__
from . import _events, _failed, _health, _jobs, _list, _migrate, _periodic, _queues, _run, _serve
from ._common import _examples, _name, _Parser, _refusal, _user_error, common_options, say
from ._run import _stopped_while_starting

_COMMANDS = (
    _migrate.add,
    _run.add,
    _jobs.add_enqueue,
    _jobs.add_cancel,
    _events.add_emit,
    _queues.add_status,
    _failed.add_failed,
    _jobs.add_show,
    _list.add_jobs,
    _jobs.add_job,
    _failed.add_replay,
    _queues.add_prune,
    _periodic.add,
    _queues.add_queue,
    _health.add,
    _serve.add,
)
"""Each command's `add`, in the order `pgworker --help` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the docs' CLI reference is generated from it."""
    common = common_options()

    p = _Parser(
        prog="pgworker",
        description=textwrap.fill(
            "Background jobs on PostgreSQL. Every command but health takes --dsn (or "
            "PGWORKER_DSN) and --schema; `pgworker COMMAND --help` shows its options and examples.",
            79,
        ),
        epilog=_examples(
            "export PGWORKER_DSN=postgresql://app@localhost/app",
            "pgworker migrate",
            "pgworker run app.handlers --concurrency 20",
            "pgworker enqueue send-invoice --payload '{\"invoice_id\": 42}'",
            "pgworker status",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--version", action="version", version=f"pgworker {__version__}", help="print the version"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    for add in _COMMANDS:
        add(sub, common)
    return p


def _has_uvloop() -> bool:
    """uvloop (a dependency on POSIX) makes the event loop's socket work several times cheaper."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    perform: Callable[[argparse.Namespace], Awaitable[int]] = args.perform
    if args.command == "run":
        signal.signal(signal.SIGTERM, _stopped_while_starting)
    try:
        return anyio.run(perform, args, backend_options={"use_uvloop": _has_uvloop()})
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = _user_error(exc)
        if error is None:
            refusal = _refusal(exc)
            if refusal is None:
                if not isinstance(exc, Exception):
                    raise
                # A bug's traceback, as Python would print it, and its exit status 1: its
                # messages may quote the database's text, so it is escaped as any other.
                say("".join(traceback.format_exception(exc)).rstrip("\n"), err=True)
                return 1
            say(
                f"pgworker {_name(args)}: error: the database refused it: {refusal}",
                err=True,
            )
            return 1
        say(f"pgworker {_name(args)}: error: {error}", err=True)
        return 2
