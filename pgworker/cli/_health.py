"""health: a worker's health file judged, for container probes; never the database."""

from __future__ import annotations

import argparse
import os

from .._runtime import health_file as _health_file
from ..errors import ValidationError
from ._common import _command, _Parser, say


def add(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
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
    health.set_defaults(perform=_health)


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
