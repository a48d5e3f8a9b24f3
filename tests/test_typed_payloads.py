"""Typed payloads hold what the worker will decode, and a refusal names the field without
repeating the value: what a hostile user got through task handles and typed payloads once.

- A model instance changed after it was built (`invoice.amount = "ten"`, or `model_construct`)
  was stored as it was: enqueue checked nothing pydantic would not revalidate, and the worker
  then failed the job as InvalidPayload. What is stored must be what the worker decodes.
- A `bytes` field holding bytes that are not UTF-8 raised UnicodeDecodeError out of the handle's
  enqueue, not a ValidationError naming the payload.
- A payload's key became the error's path as it was: a megabyte key, or one holding terminal
  escapes, was the ValidationError's `field` and message (also a 422's, and an InvalidPayload's).
- A discriminated union's wrong tag was repeated in the error (pydantic's message quotes it):
  the one place a payload's value (a secret, a megabyte) reached the error.
- `payload: Invoice | None` or `Annotated[Invoice, ...]` left the payload untyped, silently: the
  handler received a dict where it declared the model, and nothing was checked at enqueue.
- A plain `def` handler's payload was decoded on the event loop: a validator that blocks (a
  lookup by a synchronous client) stopped every other job of the worker, its heartbeats too.
"""

from __future__ import annotations

import threading
import typing
from typing import Annotated, Any, Literal

import httpx
import pydantic
import pytest

import pgworker
from pgworker._web.app import create_app
from pgworker._web.config import WebConfig

from .helpers import all_finished, statuses, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Invoice(pydantic.BaseModel):
    invoice_id: int
    amount: int


class Attachment(pydantic.BaseModel):
    name: str
    content: bytes


class Strict(pydantic.BaseModel, extra="forbid"):
    amount: int
    counts: dict[str, int] = {}


class Card(pydantic.BaseModel):
    kind: Literal["card"]


class Transfer(pydantic.BaseModel):
    kind: Literal["transfer"]


class Payment(pydantic.BaseModel):
    method: Card | Transfer = pydantic.Field(discriminator="kind")


released = threading.Event()


class Looked(pydantic.BaseModel):
    account: str

    @pydantic.field_validator("account")
    @classmethod
    def exists(cls, account: str) -> str:
        if account == "slow":  # a synchronous lookup that takes its time
            assert released.wait(30)
        return account


async def count(conn: Any) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgworker.jobs"))


async def test_a_model_changed_after_it_was_built_is_refused_and_nothing_is_written(conn) -> None:
    registry = pgworker.Registry()

    @registry.task("send-invoice")
    async def send_invoice(ctx: pgworker.JobContext, payload: Invoice) -> None: ...

    changed = Invoice(invoice_id=1, amount=5)
    changed.amount = "ten"  # type: ignore[assignment]  # no validate_assignment: pydantic takes it
    built = Invoice.model_construct(invoice_id=1)  # model_construct validates nothing
    for payload, field in [(changed, "payload.amount"), (built, "payload.amount")]:
        with pytest.raises(pgworker.ValidationError) as raised:
            await send_invoice.enqueue(conn, payload)
        assert raised.value.field == field
        with pytest.raises(pgworker.ValidationError) as raised:
            await send_invoice.enqueue_many(conn, [Invoice(invoice_id=2, amount=1), payload])
        assert raised.value.field == "payloads[1].amount"
    assert await count(conn) == 0


async def test_bytes_that_are_not_utf8_are_a_validation_error(conn) -> None:
    registry = pgworker.Registry()

    @registry.task("attach")
    async def attach(ctx: pgworker.JobContext, payload: Attachment) -> None: ...

    with pytest.raises(pgworker.ValidationError) as raised:
        await attach.enqueue(conn, {"name": "a.bin", "content": b"\xff\xfe"})
    assert raised.value.field == "payload" and "JSON" in str(raised.value)
    assert await count(conn) == 0


async def test_an_errors_path_shows_a_key_short_and_escaped(dsn, conn) -> None:
    registry = pgworker.Registry()

    @registry.task("strict", max_retries=3)
    async def strict(ctx: pgworker.JobContext, payload: Strict) -> None: ...

    key = "\x1b]0;owned\x07\x1b[2J" + "k" * 1_000_000
    for payload, prefix in [
        ({"amount": 1, key: 1}, "payload."),
        ({"amount": 1, "counts": {key: "x"}}, "payload.counts."),
    ]:
        with pytest.raises(pgworker.ValidationError) as raised:
            await strict.enqueue(conn, payload)
        field = raised.value.field
        assert field.startswith(prefix) and len(field) < 200, len(field)
        assert field.isprintable() and "\\x1b]0;owned\\x07" in field
        assert len(str(raised.value)) < 1000 and str(raised.value).isprintable()
    assert await count(conn) == 0
    # A stored payload that does not fit names the same path in its error, short and escaped.
    await pgworker.enqueue(conn, "strict", {"amount": 1, key: 1})
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    error = await conn.fetchval("SELECT error FROM pgworker.jobs")
    assert error.startswith("InvalidPayload: payload.\\x1b]0;owned\\x07") and len(error) < 1000


async def test_a_wrong_discriminator_tag_is_not_repeated_in_the_error(conn) -> None:
    registry = pgworker.Registry()

    @registry.task("pay")
    async def pay(ctx: pgworker.JobContext, payload: Payment) -> None: ...

    secret = "sk_live_" + "9" * 100_000
    with pytest.raises(pgworker.ValidationError) as raised:
        await pay.enqueue(conn, {"method": {"kind": secret}})
    assert raised.value.field == "payload.method"
    assert "sk_live_" not in str(raised.value) and "'card', 'transfer'" in str(raised.value)
    app = create_app(WebConfig(dsn="postgresql://u@h/d", insecure_no_auth=True, registry=registry))
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://pgworker") as client:
        answer = await client.post(
            "/jobs", json={"type": "pay", "payload": {"method": {"kind": secret}}}
        )
    assert answer.status_code == 422 and answer.json()["field"] == "payload.method"
    assert "sk_live_" not in answer.text
    assert await count(conn) == 0


async def test_an_optional_or_annotated_model_is_the_payloads_type(dsn, conn) -> None:
    registry = pgworker.Registry()
    seen: list[Any] = []

    @registry.task("maybe")
    async def maybe(ctx: pgworker.JobContext, payload: Invoice | None) -> None:
        seen.append(payload)

    @registry.task("described")
    async def described(
        ctx: pgworker.JobContext,
        payload: Annotated[Invoice, pydantic.Field(description="the invoice")],
    ) -> None:
        seen.append(payload)

    @registry.task("optional")
    async def optional(ctx: pgworker.JobContext, payload: typing.Optional[Invoice]) -> None:  # noqa: UP045
        seen.append(payload)

    for handle in (maybe, described, optional):
        with pytest.raises(pgworker.ValidationError) as raised:
            await handle.enqueue(conn, {"invoice_id": 1, "amount": "ten"})
        assert raised.value.field == "payload.amount", handle.name
        assert "Invoice" in str(registry.schemas()[handle.name])
    with pytest.raises(pgworker.ValidationError, match=r"^payload: None is stored as \{\}"):
        await maybe.enqueue(conn, None)  # JSON null is stored as {}: the worker would refuse it
    assert await count(conn) == 0
    await maybe.enqueue(conn, {"invoice_id": 1, "amount": 5})
    await described.enqueue(conn, Invoice(invoice_id=2, amount=6))
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    assert await statuses(conn) == {"completed": 2}
    assert sorted(seen, key=str) == [
        Invoice(invoice_id=1, amount=5),
        Invoice(invoice_id=2, amount=6),
    ]


async def test_a_plain_handlers_payload_is_decoded_off_the_event_loop(dsn, conn) -> None:
    registry = pgworker.Registry()

    @registry.task("look")
    def look(ctx: pgworker.JobContext, payload: Looked) -> str:
        return payload.account

    @registry.task("quick")
    async def quick(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        released.set()  # runs only while the event loop is free

    released.clear()
    await pgworker.enqueue(conn, "look", {"account": "slow"}, priority=30)
    async with pgworker.Worker(registry, dsn, poll_interval=0.05, concurrency=2):
        await wait_for(lambda: conn.fetchval("SELECT status = 'running' FROM pgworker.jobs"))
        await quick.enqueue(conn, {})
        await wait_for(lambda: all_finished(conn))
    released.set()
    assert await statuses(conn) == {"completed": 2}
