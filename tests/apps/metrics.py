"""Handlers served by `pgworker run tests.apps.metrics` in tests/test_metrics.py: each ends its
attempts in a known way, so that the counters a scrape shows can be predicted."""

import anyio

import pgworker

registry = pgworker.Registry()
FAST = pgworker.RetryPolicy(max_retries=3, initial_delay=0.05, max_delay=0.1)
HOSTILE = 'odd "type"\\ with\na newline, {braces} = é ' + "x" * 150
"""A job type whose name a naive exposition would break on."""


@registry.task("ok")
async def ok(ctx: pgworker.JobContext, payload: dict) -> None:
    return None


@registry.task("flaky", retry=FAST)
async def flaky(ctx: pgworker.JobContext, payload: dict) -> None:
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")


@registry.task("doomed", retry=FAST)
async def doomed(ctx: pgworker.JobContext, payload: dict) -> None:
    raise pgworker.PermanentError("never works")


@registry.task("snoozy", retry=FAST)
async def snoozy(ctx: pgworker.JobContext, payload: dict) -> None:
    if ctx.attempt == 1:
        raise pgworker.Snooze(0.05)


@registry.task("slow")
async def slow(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload["seconds"])


@registry.task(HOSTILE)
async def hostile(ctx: pgworker.JobContext, payload: dict) -> None:
    return None
