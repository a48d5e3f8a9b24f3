"""Handlers served by `pgworker run tests.apps.basic` in the CLI tests."""

import anyio
import structlog

import pgworker

registry = pgworker.Registry()


@registry.task("echo")
async def echo(ctx: pgworker.JobContext, payload: dict) -> dict:
    ctx.log.info("echoing", size=len(payload))
    structlog.get_logger("app").info("app line inside a job")
    return payload


@registry.task("sleep")
async def sleep(ctx: pgworker.JobContext, payload: dict) -> None:
    await anyio.sleep(payload["seconds"])


@registry.task("fail", max_retries=0)
async def fail(ctx: pgworker.JobContext, payload: dict) -> None:
    raise ValueError("boom")
