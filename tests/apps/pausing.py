"""Handlers served by `pgworker run tests.apps.pausing` in test_pausing.py: the basic ones, and
`hold`, which runs until the test creates the file its payload names (at most a minute)."""

import os
import time

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("sleep")
async def sleep(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload["seconds"])


@registry.task("echo")
async def echo(ctx: pgworker.JobContext, payload: dict) -> dict:
    return payload


@registry.task("hold", timeout=120)
def hold(ctx: pgworker.JobContext, payload: dict) -> None:
    """A plain def: it runs in a worker thread, where waiting on the file blocks nothing."""
    deadline = time.monotonic() + 60
    while not os.path.exists(payload["file"]) and time.monotonic() < deadline:
        time.sleep(0.02)
