"""procrastinate handlers:
`procrastinate --app bench.apps.procrastinate_app.app worker --concurrency 10`.

`make_app(dsn)` builds an App with the two tasks; the module's `app` (what the worker command
loads) is built from $BENCH_DSN."""

from __future__ import annotations

import os

import procrastinate

from .common import record_latency


async def noop() -> None:
    return None


async def latency(t: float) -> None:
    record_latency(t)


def make_app(dsn: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    app.task(name="noop")(noop)
    app.task(name="latency")(latency)
    return app


app = make_app(os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
