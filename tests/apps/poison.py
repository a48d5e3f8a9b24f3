"""Handlers for the poison tests (`pgworker run tests.apps.poison`)."""

import threading

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("work")
async def work(ctx: pgworker.JobContext, payload: dict) -> dict:
    await anyio.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n")}


@registry.task("forever-sync")
def forever_sync(ctx: pgworker.JobContext, payload: dict) -> None:
    """A plain `def` handler that never returns: its thread cannot be stopped."""
    threading.Event().wait()


@registry.task("mail-only", queue="mail")
async def mail_only(ctx: pgworker.JobContext, payload: dict) -> str:
    return "sent"
