"""Hostile handlers for tests/test_worker_keeps_serving.py (`pgworker run tests.apps.hostile`)."""

import asyncio
import sys

import pgworker

registry = pgworker.Registry()


@registry.task("work")
async def work(ctx: pgworker.JobContext, payload: dict) -> dict:
    return {"n": payload.get("n")}


@registry.task("stubborn", max_retries=0)
async def stubborn(ctx: pgworker.JobContext, payload: dict) -> None:
    """Swallows every cancellation (a retry loop with `except BaseException: continue`)."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


@registry.task("cancels-own-task", max_retries=0)
async def cancels_own_task(ctx: pgworker.JobContext, payload: dict) -> str:
    """Cancels the task it runs in, then returns (meant for a sub-task, the wrong handle)."""
    asyncio.current_task().cancel()
    return "done"


class ExitingMessage(Exception):
    def __str__(self) -> str:
        sys.exit("message unavailable")


@registry.task("str-exits", max_retries=0)
async def str_exits(ctx: pgworker.JobContext, payload: dict) -> None:
    """Raises an exception whose message calls sys.exit()."""
    raise ExitingMessage()
