"""Handlers served by `pgworker run tests.apps.limits` in test_limits.py: tasks with each kind of
limit, each holding its slot for the payload's `seconds` so that the test can sample what runs."""

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("capped", max_running=2)
async def capped(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload.get("seconds", 0.2))


@registry.task("per-key", max_running_per_key=1)
async def per_key(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload.get("seconds", 0.2))


@registry.task("rated", rate_limit="5/s")
async def rated(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload.get("seconds", 0.0))


@registry.task("plain", queue="limited")
async def plain(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload.get("seconds", 0.2))
