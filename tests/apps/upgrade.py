"""Handlers and an enqueuer for `make upgrade` (tests/upgrade.py), written against the API that
both the previous release and this tree have, so that each release's worker serves the same
module: `<venv>/bin/pgworker run tests.apps.upgrade`.

Every handler returns `code`, the folder its pgworker was imported from: the harness tells from
it which release ran each attempt, rather than trusting the worker's name.

Run as a script (`<venv>/bin/python -P tests/apps/upgrade.py enqueue DSN RELEASE RATE`), it
enqueues jobs until SIGTERM with that venv's pgworker, and prints one JSON line per acknowledged
enqueue. It is run by path with -P, never with `-m` from the repository's root: the root on
sys.path would put this tree's pgworker in front of the previous release's, and this folder its
secrets.py in front of the standard library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pgworker

CODE = os.path.dirname(os.path.abspath(pgworker.__file__))
RUNS = os.environ.get("UPGRADE_RUNS_DIR")
registry = pgworker.Registry()
RETRY = pgworker.RetryPolicy(max_retries=5, initial_delay=0.2, max_delay=0.5, jitter=0.0)


def ran(ctx: pgworker.JobContext) -> None:
    """One line per run of a handler, written before it does anything, in a file of this
    process's own: the harness counts the runs from these, not from the database it checks."""
    if RUNS:
        line = {"job": ctx.job_id, "attempt": ctx.attempt, "worker": ctx.worker_id, "code": CODE}
        with open(os.path.join(RUNS, f"runs-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


@registry.task("work", retry=RETRY)
async def work(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Sleeps `ms`; with `fail_once`, its first attempt fails (a retry the harness expects)."""
    ran(ctx)
    await asyncio.sleep(payload.get("ms", 20) / 1000)
    if payload.get("fail_once") and ctx.attempt == 1:
        raise RuntimeError("planned failure of the first attempt")
    return {"code": CODE, "attempt": ctx.attempt}


@registry.task("hold", retry=RETRY)
async def hold(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Holds its slot for `seconds`: what keeps a worker holding jobs when it is signalled."""
    ran(ctx)
    await asyncio.sleep(payload["seconds"])
    return {"code": CODE, "attempt": ctx.attempt}


async def enqueue_until_stopped(dsn: str, release: str, rate: float) -> None:
    """Enqueue about `rate` jobs a second, of every kind, until SIGTERM; one JSON line each."""
    import asyncpg

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    rng = random.Random(f"{release}-{os.getpid()}")
    conn = await asyncpg.connect(dsn)
    print(json.dumps({"code": CODE, "version": pgworker.__version__}), flush=True)

    def said(kind: str, result: Any, **more: Any) -> None:
        line = {"id": result.job.id, "kind": kind, "by": release, "created": result.created}
        print(json.dumps({**line, **more}), flush=True)

    n = 0
    try:
        while not stop.is_set():
            n += 1
            base = {"by": release, "n": n}
            roll = rng.random()
            if roll < 0.55:
                r = await pgworker.enqueue(conn, "work", {**base, "ms": rng.randint(5, 40)})
                said("plain", r)
            elif roll < 0.68:
                r = await pgworker.enqueue(conn, "work", {**base, "fail_once": True})
                said("retried", r)
            elif roll < 0.80:
                at = datetime.now(UTC) + timedelta(seconds=rng.uniform(0.5, 3))
                r = await pgworker.enqueue(conn, "work", {**base, "ms": 5}, run_at=at)
                said("scheduled", r, run_at=at.timestamp())
            elif roll < 0.88:
                r = await pgworker.enqueue(conn, "hold", {**base, "seconds": rng.uniform(1, 2)})
                said("hold", r)
            elif roll < 0.94:
                parent = await pgworker.enqueue(conn, "work", {**base, "ms": 30})
                said("parent", parent)
                child = await pgworker.enqueue(
                    conn, "work", {**base, "ms": 5, "child": True}, after=[parent.job.id]
                )
                said("child", child, parent=parent.job.id)
            else:
                # Twice the same key: the second enqueue gives back the first job while it waits.
                key = f"{release}-{n}"
                for _ in range(2):
                    r = await pgworker.enqueue(conn, "work", {**base, "ms": 5}, unique_key=key)
                    said("unique", r, key=key)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=rng.expovariate(rate))
    finally:
        await conn.close()


if __name__ == "__main__" and sys.argv[1:2] == ["enqueue"]:
    dsn_, release_, rate_ = sys.argv[2], sys.argv[3], float(sys.argv[4])
    asyncio.run(enqueue_until_stopped(dsn_, release_, rate_))
