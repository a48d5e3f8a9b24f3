"""chancy handlers: `chancy --app bench.apps.chancy_app.make_app worker start`.

Jobs run on chancy's asyncio executor in the queue "bench" (concurrency 10, eager polling),
declared by bench.py before the worker starts. chancy's per-job info lines ("Pulled …") are
silenced by running its logger at WARNING, as the other systems run."""

from __future__ import annotations

import logging
import os

from chancy import Chancy, Queue

from .common import record_latency

QUEUE = "bench"


def queue() -> Queue:
    return Queue(
        QUEUE,
        concurrency=10,
        executor=Chancy.Executor.Async,
        eager_polling=True,
    )


def make_app() -> Chancy:
    log = logging.getLogger("chancy")
    log.setLevel(logging.WARNING)
    if not log.handlers:
        log.addHandler(logging.StreamHandler())
    return Chancy(
        os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        log=log,
    )


async def noop() -> None:
    return None


async def latency(t: float) -> None:
    record_latency(t)
