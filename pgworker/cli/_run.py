"""run: serve a registry's handlers until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import cast

import anyio

from .. import _validate as validate
from .._logs import LEVELS, LogFormat, configure_logging, get_logger
from ..errors import ValidationError
from ..settings import Settings, retention
from ..worker import Worker
from ._common import (
    LOG_FORMATS,
    _command,
    _dsn,
    _from_env,
    _load,
    _Parser,
    integer,
    number,
)


def add(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
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
            "pgworker run app.handlers --pooler --listen-dsn postgresql://app@db:5432/app",
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
        help=f"jobs run at once, 1 to {validate.MAX_CONCURRENCY:,} (default: "
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
        f"{validate.MAX_WORKER_ID_LENGTH} characters (default: $PGWORKER_WORKER_ID, else "
        "host-pid-random)",
    )
    run.add_argument(
        "--poll-interval",
        type=number,
        help=f"seconds between polls when no notification arrives, more than 0 and at most "
        f"{validate.MAX_POLL_INTERVAL:g} (default: $PGWORKER_POLL_INTERVAL, else 1)",
    )
    run.add_argument(
        "--shutdown-timeout",
        type=number,
        help=f"seconds running jobs get to finish after SIGTERM, 0 to {validate.MAX_LEASE:g} "
        "(default: $PGWORKER_SHUTDOWN_TIMEOUT, else 30)",
    )
    run.add_argument(
        "--lease",
        type=number,
        help=f"seconds a claimed job is held without a heartbeat, more than 0 and at most "
        f"{validate.MAX_LEASE:g} (default: $PGWORKER_LEASE, else 30)",
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
        "--listen-dsn",
        help="LISTEN on this connection URL, which reaches PostgreSQL directly, with --pooler: "
        "without it a pooler worker polls every --poll-interval (default: "
        "$PGWORKER_LISTEN_DSN, else --dsn, or no LISTEN with --pooler)",
    )
    run.add_argument(
        "--durable-claims",
        action="store_const",
        const=True,
        help="claims wait for their WAL flush, see the guide, Workers: Fast claims (default: off; "
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
    run.set_defaults(perform=_run)


def _retention(raw: str) -> float:
    """--retain-completed, --retain-failed: a duration, or 0 / none (0: Settings keeps forever)."""
    try:
        return retention("retention", raw, error=ValidationError) or 0.0
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("retention: ")) from None


_RUN_SETTINGS = (
    "concurrency",
    "worker_id",
    "poll_interval",
    "shutdown_timeout",
    "lease",
    "listen",
    "listen_dsn",
    "pooler",
    "durable_claims",
    "schema",
    "retain_completed",
    "retain_failed",
    "health_file",
    "metrics_port",
    "metrics_host",
)
"""The options of `run` that are Settings fields of the same name (None: not given)."""


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


def _stopped_while_starting(signum: int, _frame: object) -> None:
    """SIGTERM before the worker serves: nothing is claimed yet, so stopping is clean."""
    raise SystemExit(0)
