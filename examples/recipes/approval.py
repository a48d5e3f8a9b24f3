"""Human approval: a job asks for it, waits durably (no slot held), and a web endpoint emits it."""

from __future__ import annotations

from typing import Any

import asyncpg
from fastapi import FastAPI

import pgworker

registry = pgworker.Registry()
sent: list[int] = []  # stands for the e-mail or chat message asking for the approval


def ask_for_approval(expense_id: int) -> str:
    sent.append(expense_id)
    return f"approval of expense {expense_id} requested"


@registry.task("pay-expense")
async def pay_expense(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    expense_id = payload["expense_id"]
    # A step: asked once, whatever the number of attempts.
    await ctx.step("ask", ask_for_approval, expense_id)
    try:
        decision = await ctx.wait_for_event(f"approval:{expense_id}", timeout=3 * 86400)
    except TimeoutError:
        return {"paid": False, "why": "nobody decided within 3 days"}
    if not decision["approved"]:
        return {"paid": False, "why": f"refused by {decision['by']}"}
    return {"paid": True, "approved_by": decision["by"]}


def approvals(pool: asyncpg.Pool) -> FastAPI:
    """The endpoint the approver's link or button posts to."""
    app = FastAPI()

    @app.post("/expenses/{expense_id}/decision")
    async def decide(expense_id: int, approved: bool, by: str) -> dict[str, int]:
        data = {"approved": approved, "by": by}
        woken = await pgworker.emit(pool, f"approval:{expense_id}", data)
        return {"woken": woken}

    return app
