"""procrastinate handlers:
`procrastinate --app bench.apps.procrastinate_app.app worker --concurrency 10`."""

from __future__ import annotations

import os

import procrastinate

from .common import record_latency

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
)


@app.task(name="noop")
async def noop() -> None:
    return None


@app.task(name="latency")
async def latency(t: float) -> None:
    record_latency(t)
