"""What the application calls: validate the order, then enqueue its invoice job in the caller's
transaction. The retry policy comes from configuration, checked once at start-up."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import pgworker

ORDER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def order_id(value: Any) -> str:
    """An order id the business accepts: letters, digits, `-` and `_`, at most 64."""
    if not isinstance(value, str) or not ORDER_ID.fullmatch(value):
        raise pgworker.ValidationError(
            "order_id", f"must be 1 to 64 letters, digits, - or _, got {value!r}"
        )
    return value


def retry_policy(env: Mapping[str, str] = os.environ) -> pgworker.RetryPolicy:
    """INVOICE_MAX_RETRIES (default 5), INVOICE_RETRY_DELAY (seconds, default 1) and
    INVOICE_MAX_ELAPSED (seconds, default 3600): a bad value stops the start-up, naming it."""
    max_retries = int(_number(env, "INVOICE_MAX_RETRIES", "5"))
    delay = _number(env, "INVOICE_RETRY_DELAY", "1")
    max_elapsed = _number(env, "INVOICE_MAX_ELAPSED", "3600")
    return pgworker.RetryPolicy(
        max_retries=max_retries, initial_delay=delay, max_delay=60.0, max_elapsed=max_elapsed
    )


def _number(env: Mapping[str, str], name: str, default: str) -> float:
    raw = env.get(name, default)
    try:
        return float(raw)
    except ValueError:
        raise pgworker.ConfigError(name, f"must be a number, got {raw!r}") from None


async def request_invoice(conn: Any, order: Any, amount_cents: int) -> pgworker.EnqueueResult:
    """Enqueue the order's invoice job, once per order (its idempotency key is the order id)."""
    oid = order_id(order)
    if isinstance(amount_cents, bool) or not isinstance(amount_cents, int) or amount_cents < 0:
        raise pgworker.ValidationError("amount_cents", f"must be an int >= 0, got {amount_cents!r}")
    return await pgworker.enqueue(
        conn,
        "create-invoice",
        {"order_id": oid, "amount_cents": amount_cents},
        idempotency_key=f"invoice:{oid}",
    )
