"""Invoices in PostgreSQL. `create_if_absent` is one statement: the UNIQUE order id decides, so
two attempts racing for the same order get the same invoice (no check-then-insert)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

SCHEMA = Path(__file__).with_name("schema.sql")

# DO UPDATE (of nothing) rather than DO NOTHING: it locks and returns the existing row, even one
# a concurrent transaction committed after this statement began. xmax = 0 only on a fresh insert.
_CREATE = """
INSERT INTO invoices (order_id, amount_cents) VALUES ($1, $2)
ON CONFLICT (order_id) DO UPDATE SET order_id = EXCLUDED.order_id
RETURNING id, order_id, amount_cents, (xmax = 0) AS created
"""


class Invoice(NamedTuple):
    id: int
    order_id: str
    amount_cents: int
    created: bool


async def create_schema(conn: Any) -> None:
    await conn.execute(SCHEMA.read_text())


async def create_if_absent(conn: Any, order_id: str, amount_cents: int) -> Invoice:
    """The order's invoice: created now, or the one that already exists (`created` False)."""
    row = await conn.fetchrow(_CREATE, order_id, amount_cents)
    return Invoice(row["id"], row["order_id"], row["amount_cents"], row["created"])


async def invoices_of(conn: Any, order_id: str) -> list[Invoice]:
    rows = await conn.fetch(
        "SELECT id, order_id, amount_cents, false AS created FROM invoices WHERE order_id = $1",
        order_id,
    )
    return [Invoice(*r) for r in rows]
