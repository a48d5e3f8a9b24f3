"""The command line: the only place that parses arguments, runs the event loop and installs
signal handlers. A user's mistake is one line on stderr and exit status 2, never a traceback.

argparse, not click or typer: the parser is a table of options whose help states each default
and environment variable, which click would not make shorter (each option is the same one
declaration), and argparse adds no dependency to a library that services embed. What the
commands print is made in _render.py; the logs are configured by `configure_logging`, as an
application embedding a Worker may do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import textwrap
import traceback
from collections.abc import Sequence
from datetime import datetime
from typing import NoReturn, cast

import anyio
import asyncpg

from . import _health_file, _render
from . import _limits as limits
from ._db.connection import connect
from ._db.migrations import check_schema
from ._logs import LEVELS, LogFormat, configure_logging, get_logger
from ._service import describe
from ._version import DISTRIBUTION, __version__
from .enqueue import enqueue
from .errors import ConfigError, PgWorkerError, ValidationError
from .models import DEFAULT_SCHEMA, PRIORITY_LABELS
from .operations import (
    FINISHED,
    CancelResult,
    cancel,
    list_failed,
    migrate,
    prune,
    replay,
    show_job,
    since_moment,
    status,
)
from .registry import Registry, load
from .settings import Settings, default_worker_id, dsn_from_env, duration, retention
from .worker import Worker

LIVE_WITHIN = 60.0
_BODY_LIMIT = 1024 * 1024


def say(text: str, *, err: bool = False) -> None:
    """Print one message (lines joined by newlines) on stdout, or stderr: the only way the CLI
    prints. Text from the database is anybody's, so every control character in it (ESC, CR, C1,
    bidi overrides: see `_render.terminal`) is shown escaped, never obeyed by the terminal."""
    print(_render.terminal(text), file=sys.stderr if err else sys.stdout)


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


def _priority(raw: str) -> int:
    """--priority: an int, or a label limits.priority knows."""
    value: int | str
    try:
        value = limits.whole(raw)
    except ValueError:
        value = raw
    try:
        return limits.priority("priority", value)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("priority: ")) from None


def _retention(raw: str) -> float:
    """--retain-completed, --retain-failed: a duration, or 0 / none (0: Settings keeps forever)."""
    try:
        return retention("retention", raw, error=ValidationError) or 0.0
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("retention: ")) from None


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


def _parser() -> argparse.ArgumentParser:
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

    _command(
        sub,
        "migrate",
        [common],
        "create or upgrade the schema",
        "Create or upgrade pgworker's schema (the numbered migrations in sql/migrations, each "
        "once); safe to run concurrently, e.g. from every container at start-up.",
        [
            "pgworker migrate --dsn postgresql://app@localhost/app",
            "PGWORKER_SCHEMA=jobs pgworker migrate     # in schema `jobs`",
        ],
    )

    run = _command(
        sub,
        "run",
        [common],
        "serve the handlers of a module",
        "Serve the tasks of a pgworker.Registry until SIGTERM or SIGINT: the first signal stops "
        "claiming and lets running jobs finish within --shutdown-timeout, a second hands them "
        "back at once.",
        [
            "pgworker run app.handlers",
            "pgworker run app.handlers:registry --concurrency 20 --queue default --queue mail",
            "pgworker run app.handlers --log-format json --log-level warning",
            "PGWORKER_QUEUES=default,mail pgworker run app.handlers --no-listen",
            "pgworker run app.handlers --retain-completed 1d --retain-failed none",
            "pgworker run app.handlers --metrics-port 9100 --metrics-host 0.0.0.0",
        ],
    )
    run.add_argument(
        "target",
        metavar="MODULE[:ATTR]",
        help="the module holding a pgworker.Registry, imported from the current directory; "
        "ATTR names it when the module holds several (required)",
    )
    run.add_argument(
        "--concurrency",
        type=integer,
        help=f"jobs run at once, 1 to {limits.MAX_CONCURRENCY:,} (default: "
        "$PGWORKER_CONCURRENCY, else 10)",
    )
    run.add_argument(
        "--queue",
        dest="queues",
        action="append",
        help="a queue to serve; repeat for several (default: $PGWORKER_QUEUES, comma-separated, "
        "else every queue the registry's tasks name, plus default)",
    )
    run.add_argument(
        "--worker-id",
        help=f"this worker's name in `pgworker status` and the logs, at most "
        f"{limits.MAX_WORKER_ID_LENGTH} characters (default: $PGWORKER_WORKER_ID, else "
        "host-pid-random)",
    )
    run.add_argument(
        "--poll-interval",
        type=number,
        help=f"seconds between polls when no notification arrives, more than 0 and at most "
        f"{limits.MAX_POLL_INTERVAL:g} (default: $PGWORKER_POLL_INTERVAL, else 1)",
    )
    run.add_argument(
        "--shutdown-timeout",
        type=number,
        help=f"seconds running jobs get to finish after SIGTERM, 0 to {limits.MAX_LEASE:g} "
        "(default: $PGWORKER_SHUTDOWN_TIMEOUT, else 30)",
    )
    run.add_argument(
        "--lease",
        type=number,
        help=f"seconds a claimed job is held without a heartbeat, more than 0 and at most "
        f"{limits.MAX_LEASE:g} (default: $PGWORKER_LEASE, else 30)",
    )
    run.add_argument(
        "--no-listen",
        dest="listen",
        action="store_const",
        const=False,
        help="poll only, without LISTEN/NOTIFY (default: listen; $PGWORKER_LISTEN=false "
        "turns it off too)",
    )
    run.add_argument(
        "--durable-claims",
        action="store_const",
        const=True,
        help="claims wait for their WAL flush, see the README, Fast claims (default: off; "
        "$PGWORKER_DURABLE_CLAIMS=true turns it on too)",
    )
    run.add_argument(
        "--retain-completed",
        type=_retention,
        help="delete completed jobs this long after they finished, e.g. 12h, 7d, 4w; 0 or none "
        "keeps them forever (default: $PGWORKER_RETAIN_COMPLETED, else 7d)",
    )
    run.add_argument(
        "--retain-failed",
        type=_retention,
        help="delete failed and cancelled jobs this long after they finished; 0 or none keeps "
        "them forever (default: $PGWORKER_RETAIN_FAILED, else 30d)",
    )
    run.add_argument(
        "--health-file",
        metavar="PATH",
        help="rewrite this file at each heartbeat with the services' health, for `pgworker "
        "health` (default: $PGWORKER_HEALTH_FILE, else none)",
    )
    run.add_argument(
        "--metrics-port",
        type=integer,
        help="serve Prometheus metrics at http://HOST:PORT/metrics, port 1 to 65535; needs the "
        "metrics extra (default: $PGWORKER_METRICS_PORT, else no metrics)",
    )
    run.add_argument(
        "--metrics-host",
        help="the address the metrics server listens on, 0.0.0.0 in a container (default: "
        "$PGWORKER_METRICS_HOST, else 127.0.0.1)",
    )
    run.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="json: one JSON object per line; console: readable lines; both on stderr "
        "(default: $PGWORKER_LOG_FORMAT, else console)",
    )
    run.add_argument(
        "--log-level",
        choices=list(LEVELS),
        help="the lowest level logged: info shows one line per finished job, debug adds "
        "`job started` lines (default: $PGWORKER_LOG_LEVEL, else info)",
    )

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
        ],
    )
    enq.add_argument(
        "type",
        metavar="TYPE",
        help=f"the job type, a task of the registry, at most {limits.MAX_TYPE_LENGTH} "
        "characters (required)",
    )
    enq.add_argument(
        "--payload",
        default="{}",
        help=f"the payload as JSON, nested at most {limits.MAX_DEPTH} deep (default: {{}})",
    )
    enq.add_argument(
        "--queue",
        help=f"the job's queue, at most {limits.MAX_QUEUE_LENGTH} characters (default: default)",
    )
    enq.add_argument(
        "--priority",
        type=_priority,
        help=f"an int or one of {', '.join(PRIORITY_LABELS)} "
        f"({', '.join(str(v) for v in PRIORITY_LABELS.values())}); higher runs first "
        "(default: 0)",
    )
    enq.add_argument(
        "--max-retries",
        type=integer,
        help="retries after the first attempt (default: the task's, else 3)",
    )
    enq.add_argument(
        "--idempotency-key",
        help="a later enqueue with this key returns this job instead (default: none)",
    )
    enq.add_argument(
        "--correlation-id",
        help="carried by the job's log lines (default: a new UUID)",
    )
    enq.add_argument(
        "--delay",
        type=number,
        help=f"run no sooner than this many seconds from now, at most {limits.MAX_DELAY:,.0f} "
        "(ten years) (default: now)",
    )
    enq.add_argument(
        "--run-at",
        help="run no sooner than this ISO 8601 time with a timezone, e.g. "
        "2030-01-01T09:00:00+00:00; not with --delay (default: now)",
    )

    can = _command(
        sub,
        "cancel",
        [common],
        "cancel a job",
        "Cancel a pending job, or ask the worker of a running job to stop it; a finished job "
        "is left as it is. Prints what happened.",
        [
            "pgworker cancel 42",
            "pgworker cancel 42 --schema jobs",
        ],
    )
    can.add_argument("job_id", metavar="ID", type=_job_id, help="the job's id (required)")

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
    _failed_jobs_commands(sub, common)

    health = _command(
        sub,
        "health",
        [],
        "exit 0 when a worker's health file says it is healthy",
        "Read the file that `pgworker run --health-file PATH` rewrites at each heartbeat, and "
        "exit 0 only when it was written less than the worker's lease ago and every service in "
        "it is ok or retrying; else print one line saying why (no file, stale by N s, a service "
        "stopped, unreadable JSON) and exit 1. Reads the file only, never the database: for "
        "Docker's HEALTHCHECK and Kubernetes exec probes.",
        [
            "pgworker health --health-file /tmp/pgworker-health.json",
            "PGWORKER_HEALTH_FILE=/tmp/pgworker-health.json pgworker health",
        ],
    )
    health.add_argument(
        "--health-file",
        metavar="PATH",
        help="the file a worker's `pgworker run --health-file` writes (default: "
        "$PGWORKER_HEALTH_FILE; required if it is not set)",
    )
    _serve_command(sub, common)
    return p


SINCE_HELP = (
    "only jobs that failed within this duration (30s, 15m, 2h, 7d, 1w, or seconds) or since "
    "this ISO 8601 time with a time zone (default: any time)"
)


def _failed_jobs_commands(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """failed list, show, replay, prune: the dead-letter set and retention by hand."""
    failed = _command(
        sub,
        "failed",
        [],
        "the failed jobs (see `pgworker failed list`)",
        "The failed jobs, kept apart for diagnosis: `pgworker failed list` shows them, "
        "`pgworker show ID` one in full, `pgworker replay` runs them again.",
        [
            "pgworker failed list",
            "pgworker failed list --type send-invoice --since 2h --json",
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
        ],
    )
    rep.add_argument(
        "ids",
        metavar="ID",
        type=_job_id,
        nargs="*",
        help="the jobs to replay (required, unless --type is given)",
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


def _serve_command(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    """serve: the HTTP API and the dashboard (the `web` extra)."""
    srv = _command(
        sub,
        "serve",
        [common],
        "the HTTP API and the web dashboard",
        "Serve the HTTP API (OpenAPI document at /openapi.json) and the dashboard at / until "
        "SIGTERM or SIGINT. Every route but /healthz needs `Authorization: Bearer TOKEN`, "
        "TOKEN one of --token or $PGWORKER_API_TOKEN; serve refuses to start without a token "
        "unless --insecure-no-auth. It also takes part in the election of the maintenance "
        "leader, which rescues expired leases and prunes finished jobs (--no-maintenance to opt "
        "out). Needs the web extra: pip install 'pgworker-queue[web]'.",
        [
            "PGWORKER_API_TOKEN=s3cret pgworker serve",
            "pgworker serve --host 0.0.0.0 --port 9000 --token s3cret --read-only",
            "PGWORKER_API_TOKEN=old-token,new-token pgworker serve    # both accepted",
        ],
    )
    srv.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on; 0.0.0.0 for every interface, e.g. in a container "
        "(default: 127.0.0.1)",
    )
    srv.add_argument(
        "--port", type=integer, default=8080, help="the TCP port, 1 to 65535 (default: 8080)"
    )
    srv.add_argument(
        "--token",
        dest="tokens",
        action="append",
        metavar="TOKEN",
        help="a bearer token clients must send; repeat for several. The tokens of "
        "$PGWORKER_API_TOKEN (comma-separated: old,new while rotating) are accepted as well; "
        "prefer the variable, a command line is visible to every user of the host "
        "(default: $PGWORKER_API_TOKEN; required unless --insecure-no-auth)",
    )
    srv.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="accept requests without a token: only on a trusted network (default: off)",
    )
    srv.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every write (enqueue, claim, heartbeat, complete, fail, cancel, replay) "
        "with 405, and take no part in maintenance (it writes: rescue, pruning) (default: off)",
    )
    srv.add_argument(
        "--no-maintenance",
        dest="maintenance",
        action="store_false",
        help="take no part in the maintenance election: leave rescue and pruning to "
        "`pgworker run` (default: take part)",
    )
    srv.add_argument(
        "--body-limit",
        type=integer,
        metavar="BYTES",
        default=_BODY_LIMIT,
        help=f"the largest request body accepted, in bytes; a larger one is refused with 413 "
        f"(default: {_BODY_LIMIT} = 1 MB)",
    )
    srv.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="json or console, on stderr (default: $PGWORKER_LOG_FORMAT, else console)",
    )
    srv.add_argument(
        "--log-level",
        choices=list(LEVELS),
        help="the lowest level logged (default: $PGWORKER_LOG_LEVEL, else info)",
    )


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or dsn_from_env()
    if not dsn:
        raise PgWorkerError("no database given; pass --dsn or set PGWORKER_DSN or DATABASE_URL")
    return dsn


LOG_FORMATS = ["json", "console"]
_RUN_SETTINGS = (
    "concurrency",
    "worker_id",
    "poll_interval",
    "shutdown_timeout",
    "lease",
    "listen",
    "durable_claims",
    "schema",
    "retain_completed",
    "retain_failed",
    "health_file",
    "metrics_port",
    "metrics_host",
)
"""The options of `run` that are Settings fields of the same name (None: not given)."""


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


async def _migrate(args: argparse.Namespace) -> int:
    conn = await connect(_dsn(args))
    try:
        applied = await migrate(conn, schema=_schema(args))
    finally:
        await conn.close()
    say(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


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


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


async def _run(args: argparse.Namespace) -> int:
    configure_logging(
        cast(
            LogFormat, args.log_format or _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")
        ),
        args.log_level or _from_env("PGWORKER_LOG_LEVEL", list(LEVELS), "info"),
    )
    registry = _load(args.target)
    given = {name: getattr(args, name) for name in _RUN_SETTINGS}
    queues = tuple(args.queues) if args.queues else None
    settings = Settings.from_env(dsn=_dsn(args), queues=queues, **given)
    worker = Worker(registry, settings=settings)
    log = get_logger(worker_id=settings.worker_id)

    async def on_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            seen = 0
            async for signum in received:
                seen += 1
                name = signal.Signals(signum).name
                if seen == 1:
                    log.info(f"{name} received: stopping", grace_s=settings.shutdown_timeout)
                    worker.stop()
                else:
                    log.warning(f"{name} received again: handing back running jobs now")
                    worker.interrupt()

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals)
        await worker.run()
        tg.cancel_scope.cancel()
    if worker.abandoned:
        # A handler that ignores its cancellation still runs in a task of this loop, which would
        # wait for it forever on closing: its job was handed back, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


async def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except RecursionError:
        raise ValidationError(
            "payload", f"must not nest lists and objects more than {limits.MAX_DEPTH} deep"
        ) from None
    except ValueError as exc:
        raise PgWorkerError(f"--payload is not valid JSON: {exc}") from None
    run_at = None
    if args.run_at:
        try:
            run_at = datetime.fromisoformat(args.run_at)
        except ValueError as exc:
            raise PgWorkerError(f"--run-at {args.run_at!r} is not an ISO 8601 time") from exc
        if run_at.tzinfo is None:
            raise ValidationError(
                "--run-at", f"{args.run_at!r} has no time zone; add one, e.g. {args.run_at}+00:00"
            )
        if args.delay is not None:
            raise ValidationError("--run-at", "give --run-at or --delay, not both")
    conn = await connect(_dsn(args))
    try:
        result = await enqueue(
            conn,
            args.type,
            payload,
            queue=args.queue,
            priority=args.priority,
            max_retries=args.max_retries,
            idempotency_key=args.idempotency_key,
            correlation_id=args.correlation_id,
            run_at=run_at,
            delay=args.delay,
            schema=_schema(args),
        )
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
    conn = await connect(_dsn(args))
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


async def _status(args: argparse.Namespace) -> int:
    conn = await connect(_dsn(args))
    try:
        await check_schema(conn, _schema(args))
        found = await status(conn, schema=_schema(args), live_within=LIVE_WITHIN)
    finally:
        await conn.close()
    say(_render.status_json(found) if args.json else _render.status_text(found))
    return 0


async def _failed(args: argparse.Namespace) -> int:
    """`failed list` (the only subcommand of `failed`)."""
    since = since_moment("--since", args.since)
    limit = limits.count("--limit", args.limit, minimum=1)
    conn = await connect(_dsn(args))
    try:
        found = await list_failed(
            conn, type=args.type, queue=args.queue, since=since, limit=limit, schema=_schema(args)
        )
    finally:
        await conn.close()
    say(_render.failed_json(found) if args.json else _render.failed_text(found))
    return 0


async def _show(args: argparse.Namespace) -> int:
    dsn = _dsn(args)
    keys = Settings.from_env(dsn=dsn).redact_keys
    conn = await connect(dsn)
    try:
        found = await show_job(conn, args.job_id, redact_keys=keys, schema=_schema(args))
    finally:
        await conn.close()
    if found is None:
        raise ValidationError("ID", f"there is no job {args.job_id}")
    say(_render.show_json(found) if args.json else _render.show_text(found))
    return 0


async def _replay(args: argparse.Namespace) -> int:
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
    conn = await connect(_dsn(args))
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


async def _prune(args: argparse.Namespace) -> int:
    older_than = duration("--older-than", args.older_than)
    if older_than == 0:
        raise ValidationError("--older-than", "must be more than 0 (1s prunes every finished job)")
    conn = await connect(_dsn(args))
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


async def _health(args: argparse.Namespace) -> int:
    path = args.health_file or os.environ.get("PGWORKER_HEALTH_FILE")
    if not path:
        raise ValidationError(
            "--health-file",
            "give the file `pgworker run --health-file` writes, or set PGWORKER_HEALTH_FILE",
        )
    verdict = _health_file.judge(path)
    if verdict.healthy:
        say(f"pgworker health: ok: {verdict.reason}")
        return 0
    # 1, not 2: Docker's HEALTHCHECK reserves exit status 2.
    say(f"pgworker health: unhealthy: {verdict.reason}", err=True)
    return 1


_TOKEN = re.compile(r"[!-~]{1,1000}")
"""A token: visible ASCII but the comma (it separates tokens in $PGWORKER_API_TOKEN)."""


def _tokens(args: argparse.Namespace) -> tuple[str, ...]:
    """Every token of --token and $PGWORKER_API_TOKEN, each checked."""
    given = [("--token", t) for t in args.tokens or ()]
    env = os.environ.get("PGWORKER_API_TOKEN", "")
    given += [("PGWORKER_API_TOKEN", t.strip()) for t in env.split(",") if t.strip()]
    for field, token in given:
        if not _TOKEN.fullmatch(token) or "," in token:
            raise ConfigError(
                field,
                "a token is 1 to 1000 visible ASCII characters, without spaces or commas",
            )
    return tuple(dict.fromkeys(t for _, t in given))


async def _serve(args: argparse.Namespace) -> int:
    level = args.log_level or _from_env("PGWORKER_LOG_LEVEL", list(LEVELS), "info")
    configure_logging(
        cast(
            LogFormat, args.log_format or _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")
        ),
        level,
    )
    limits.count("--port", args.port, minimum=1, maximum=65535)
    limits.count("--body-limit", args.body_limit, minimum=1)
    limits.name("--host", args.host, 253)
    tokens = _tokens(args)
    if not tokens and not args.insecure_no_auth:
        raise ConfigError(
            "--token",
            "serve needs a token: set PGWORKER_API_TOKEN (or pass --token), or pass "
            "--insecure-no-auth to accept requests without one",
        )
    try:
        from ._web.app import WebConfig
        from ._web.server import serve
    except ImportError as exc:
        missing = exc.name or "a dependency"
        raise PgWorkerError(
            f"serve needs the web extra ({missing} is missing): pip install '{DISTRIBUTION}[web]'"
        ) from None
    dsn, schema = _dsn(args), _schema(args)
    conn = await connect(dsn)
    try:
        await check_schema(conn, schema)
    finally:
        await conn.close()
    worker_id = f"serve-{default_worker_id()}"
    maintenance = args.maintenance and not args.read_only  # read-only: no write of any kind
    if maintenance:  # what maintenance reads from PGWORKER_*, checked before serving
        Settings.from_env(dsn=dsn, schema=schema, worker_id=worker_id)
    config = WebConfig(
        dsn=dsn,
        schema=schema,
        tokens=tokens,
        insecure_no_auth=args.insecure_no_auth,
        read_only=args.read_only,
        body_limit=args.body_limit,
        maintenance=maintenance,
        worker_id=worker_id,
    )
    await serve(config, args.host, args.port, log_level=level)
    return 0


COMMANDS = {
    "migrate": _migrate,
    "run": _run,
    "enqueue": _enqueue,
    "cancel": _cancel,
    "status": _status,
    "failed": _failed,
    "show": _show,
    "replay": _replay,
    "prune": _prune,
    "health": _health,
    "serve": _serve,
}


def _user_error(exc: BaseException) -> PgWorkerError | None:
    """The PgWorkerError behind `exc`, looking through task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, PgWorkerError) else None


def _refusal(exc: BaseException) -> str | None:
    """What the server said when it refused a statement (read-only, a privilege, a trigger of
    the user's own), as one line."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if not isinstance(exc, asyncpg.PostgresError):
        return None
    return describe(exc).replace("\n", " ")


def _has_uvloop() -> bool:
    """uvloop (a dependency on POSIX) makes the event loop's socket work several times cheaper."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _stopped_while_starting(signum: int, _frame: object) -> None:
    """SIGTERM before the worker serves: nothing is claimed yet, so stopping is clean."""
    raise SystemExit(0)


def _name(args: argparse.Namespace) -> str:
    """The command as typed: `failed list` has a subcommand."""
    sub = getattr(args, "failed_command", None)
    return f"{args.command} {sub}" if sub else str(args.command)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        signal.signal(signal.SIGTERM, _stopped_while_starting)
    try:
        return anyio.run(
            COMMANDS[args.command], args, backend_options={"use_uvloop": _has_uvloop()}
        )
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


if __name__ == "__main__":
    sys.exit(main())


build_parser = _parser
