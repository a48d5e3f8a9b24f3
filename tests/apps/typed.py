"""Typed tasks served by `pgworker serve --app tests.apps.typed` in test_typed_tasks.py."""

from __future__ import annotations

import pydantic

import pgworker

registry = pgworker.Registry()


class Item(pydantic.BaseModel):
    sku: str
    quantity: int = 1


class Invoice(pydantic.BaseModel):
    invoice_id: int
    amount: int
    items: list[Item] = []


@registry.task("send-invoice", queue="billing", priority="high", max_retries=5)
async def send_invoice(ctx: pgworker.JobContext, payload: Invoice) -> int:
    return payload.amount


@registry.task("echo")
async def echo(ctx: pgworker.JobContext, payload: dict) -> dict:
    return payload
