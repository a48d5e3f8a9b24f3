"""Hostile handlers for tests/test_cancelled_workers_and_refused_writes.py
(`pgworker run tests.apps.hostile2`)."""

import os
import sys

import pgworker

registry = pgworker.Registry()


@registry.task("work")
async def work(ctx: pgworker.JobContext, payload: dict) -> dict:
    return {"n": payload.get("n")}


@registry.task("forks", max_retries=0)
def forks(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Forks a child that does some work and ends with sys.exit(), as a script would; the
    parent returns the child's pid."""
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    return {"child": pid}


@registry.task("forks-async", max_retries=0)
async def forks_async(ctx: pgworker.JobContext, payload: dict) -> dict:
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    return {"child": pid}
