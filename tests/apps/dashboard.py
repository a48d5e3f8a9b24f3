"""Handlers for the dashboard's browser tests (`pgworker run tests.apps.dashboard`): jobs that fail
once then succeed (what a replay mends), that report milestones and steps, that keep a worker
busy, and whose errors carry whatever text the payload asks for."""

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("charge-card", max_retries=0)
async def charge_card(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Fails its first attempt with the payload's `message` (a declined card), then succeeds."""
    if ctx.attempt == 1:
        raise pgworker.PermanentError(payload.get("message", "card declined"))
    await ctx.progress("charged", {"amount": payload.get("amount")})
    return {"charged": payload.get("amount")}


@registry.task("send-invoice", queue="mail")
async def send_invoice(ctx: pgworker.JobContext, payload: dict) -> dict:
    """Renders, reports a milestone, sends: two durable steps."""
    pdf = await ctx.step("render-pdf", _render, payload["invoice_id"])
    await ctx.progress("pdf rendered", {"pages": pdf["pages"]})
    await ctx.step("email", _send, payload.get("to", "billing@example.com"))
    await ctx.progress("emailed")
    return {"sent": True, "pdf": pdf["name"]}


async def _render(invoice_id: int) -> dict:
    return {"name": f"invoice-{invoice_id}.pdf", "pages": 2}


async def _send(to: str) -> dict:
    return {"to": to, "message_id": "m-20261201-0001"}


@registry.task("resize-image", max_retries=0, queue="media")
async def resize_image(ctx: pgworker.JobContext, payload: dict) -> None:
    """Holds its worker for `seconds` (in progress on the pages) after a first milestone."""
    await ctx.progress("downloaded", {"bytes": 481_233})
    await anyio.sleep(payload.get("seconds", 3600))


@registry.task("sync-crm", retry=pgworker.RetryPolicy(max_retries=5, initial_delay=300.0))
async def sync_crm(ctx: pgworker.JobContext, payload: dict) -> None:
    """Fails transiently: its job waits for a retry, in progress with an error."""
    raise ConnectionError("crm.example.com:443 refused the connection")
