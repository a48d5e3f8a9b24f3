"""A small application whose jobs `test_shop.py` tests with pgworker.testing: placing an order
enqueues its receipt in the same transaction; the receipt is mailed in a step, and a review is
asked for a week later."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg

import pgworker

SCHEMA = "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, email text NOT NULL)"

registry = pgworker.Registry()

outbox: list[dict[str, str]] = []
"""The mails sent (a real application calls its mail provider)."""
mail_down_for = 0
"""How many of the next calls to the mail provider fail (a test sets it)."""


async def place_order(conn: asyncpg.Connection, order_id: int, email: str) -> int:
    """Record the order and enqueue its receipt: both commit, or neither."""
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO orders (id, email) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            order_id,
            email,
        )
        result = await pgworker.enqueue(
            conn,
            "send-receipt",
            {"order_id": order_id, "email": email},
            idempotency_key=f"receipt-{order_id}",
        )
    return result.job.id


async def send_mail(to: str, subject: str) -> str:
    global mail_down_for
    if mail_down_for > 0:
        mail_down_for -= 1
        raise ConnectionError("mail provider unreachable")
    outbox.append({"to": to, "subject": subject})
    return f"msg-{len(outbox)}"


async def ask_review_later(conn: asyncpg.Connection, order_id: int, email: str) -> int:
    review = await pgworker.enqueue(
        conn,
        "ask-review",
        {"order_id": order_id, "email": email},
        delay=timedelta(days=7),
        idempotency_key=f"review-{order_id}",
    )
    return review.job.id


@registry.task("send-receipt", retry=pgworker.RetryPolicy(max_retries=5, initial_delay=60))
async def send_receipt(ctx: pgworker.JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    order_id, email = payload["order_id"], payload["email"]
    if "@" not in email:
        raise pgworker.PermanentError(f"not an address: {email!r}")
    message = await ctx.step("mail", send_mail, email, f"Your order {order_id}")
    await ctx.progress("mailed", {"message": message})
    review = await ctx.transactional_step("review", ask_review_later, order_id, email)
    return {"message": message, "review_job": review}


@registry.task("ask-review")
async def ask_review(ctx: pgworker.JobContext, payload: dict[str, Any]) -> str:
    subject = f"How was order {payload['order_id']}?"
    message: str = await ctx.step("mail", send_mail, payload["email"], subject)
    return message
