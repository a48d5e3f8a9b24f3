"""The invoice task: `pgworker run examples.invoices.tasks`.

The invoice is created in a transactional step: the INSERT and the step's checkpoint commit
together, so a retry, a rescue or a replay of the job finds the step done and never inserts
twice (and `create_if_absent` would return the existing invoice even without the step)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

import pgworker

from . import repository, service

registry = pgworker.Registry()


async def _create(conn: Any, order_id: str, amount_cents: int) -> dict[str, Any]:
    invoice = await repository.create_if_absent(conn, order_id, amount_cents)
    return {"invoice_id": invoice.id, "created": invoice.created}


@registry.task("create-invoice", retry=service.retry_policy())
async def create_invoice(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    order_id = service.order_id(payload["order_id"])
    invoice = await ctx.transactional_step("invoice", _create, order_id, payload["amount_cents"])
    await ctx.progress("invoice created", {"invoice_id": invoice["invoice_id"]})
    await _crash_point(ctx, order_id)
    await ctx.step("notify", _notify, order_id, invoice["invoice_id"])
    await ctx.progress("customer notified")
    return {"invoice_id": invoice["invoice_id"]}


def _notify(order_id: str, invoice_id: int) -> dict[str, Any]:
    """Tell the customer. INVOICE_MAIL_DOWN names a file whose presence stands for the mail
    service being down: the step fails for good until an operator fixes it and replays."""
    down = os.environ.get("INVOICE_MAIL_DOWN")
    if down and Path(down).exists():
        raise pgworker.PermanentError("the mail service is down")
    return {"notified": order_id, "invoice_id": invoice_id}


async def _crash_point(ctx: pgworker.JobContext, order_id: str) -> None:
    """For the crash test only: with INVOICE_CRASH_DIR set, the first attempt says where it is
    (a file) and waits there, after the invoice and before the acknowledgement, to be killed."""
    where = os.environ.get("INVOICE_CRASH_DIR")
    if where and ctx.attempt == 1:
        (Path(where) / f"{order_id}.created").write_text(str(ctx.job_id))
        await anyio.sleep_forever()
