"""run: serve a registry's handlers until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import cast

import anyio

from .._logs import LEVELS, LogFormat, configure_logging, get_logger
from ..settings import SETTINGS, Settings
from ..worker import Worker
from ._common import (
    LOG_FORMATS,
    _command,
    _dsn,
    _from_env,
    _load,
    _Parser,
    add_setting,
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
    for name, setting in SETTINGS.items():
        if setting.flag is not None and not setting.common:
            add_setting(run, name)
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


async def _run(args: argparse.Namespace) -> int:
    configure_logging(
        cast(
            LogFormat, args.log_format or _from_env("PGWORKER_LOG_FORMAT", LOG_FORMATS, "console")
        ),
        args.log_level or _from_env("PGWORKER_LOG_LEVEL", list(LEVELS), "info"),
    )
    registry = _load(args.target)
    given = {name: getattr(args, name, None) for name in SETTINGS if name != "dsn"}
    given["queues"] = tuple(args.queues) if args.queues else None
    settings = Settings.from_env(dsn=_dsn(args), **given)
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
