"""The handlers the recipes serve: `pgworker run examples.recipes.tasks`."""

from __future__ import annotations

from typing import Any

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("send-email", queue="mail")
async def send_email(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    if "@" not in payload["to"]:
        raise pgworker.PermanentError(f"not an address: {payload['to']!r}")
    return {"sent_to": payload["to"]}


@registry.task("build-report", queue="reports")
async def build_report(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    await anyio.sleep(payload.get("seconds", 0))
    return {"report": payload["name"]}
