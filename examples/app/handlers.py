"""The example application's handlers: `pgworker run examples.app.handlers`."""

from __future__ import annotations

import pgworker

registry = pgworker.Registry()

QUICK_RETRIES = pgworker.RetryPolicy(max_retries=3, initial_delay=0.2, max_delay=1.0)


@registry.task("send-invoice", priority="high")
async def send_invoice(ctx: pgworker.JobContext, payload: dict) -> dict:
    ctx.log.info("invoice sent", invoice_id=payload["invoice_id"])
    return {"sent": payload["invoice_id"]}


@registry.task("sync-crm", retry=QUICK_RETRIES)
async def sync_crm(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Fails on its first two attempts (a flaky upstream), then succeeds."""
    if ctx.attempt <= 2:
        raise ConnectionError(f"CRM unavailable (attempt {ctx.attempt})")
    return {"synced": payload["customer_id"]}


@registry.task("charge-card")
async def charge_card(ctx: pgworker.JobContext, payload: dict) -> None:
    raise pgworker.PermanentError(f"card {payload['card']} declined")


@registry.task("resize-image")
def resize_image(ctx: pgworker.JobContext, payload: dict) -> dict:
    """A plain `def` handler: it runs in a worker thread."""
    return {"thumbnail": f"{payload['path']}.thumb.png"}
