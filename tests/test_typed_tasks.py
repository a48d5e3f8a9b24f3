"""Task handles and typed payloads: `@registry.task` gives a handle that enqueues with the task's
options, and a payload annotation (a pydantic model, a dataclass or a TypedDict) is the payload's
schema, checked at enqueue (nothing written when wrong) and decoded before the handler runs."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from datetime import UTC, datetime
from typing import Any

import anyio
import pydantic
import pytest
import typing_extensions

import pgworker
from pgworker import RetryPolicy
from pgworker._web.app import create_app
from pgworker._web.config import WebConfig

from .apps.typed import Invoice, Item
from .apps.typed import registry as typed_registry
from .apps.typed import send_invoice as typed_send_invoice
from .helpers import ROOT, all_finished, attempts, statuses, wait_for
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclasses.dataclass
class Reminder:
    invoice_id: int
    when: datetime


class Receipt(typing_extensions.TypedDict):
    invoice_id: int
    email: str


class Refund(pydantic.BaseModel):
    invoice_id: int
    amount: int


async def count(conn: Any) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgworker.jobs"))


def invoices() -> tuple[pgworker.Registry, Any]:
    registry = pgworker.Registry()

    @registry.task("send-invoice", queue="billing", priority="high", max_retries=5, version=2)
    async def send_invoice(ctx: pgworker.JobContext, payload: Invoice) -> int:
        """Send one invoice."""
        return payload.amount

    return registry, send_invoice


async def test_a_wrong_field_is_refused_naming_its_path_and_nothing_is_written(conn) -> None:
    registry, send_invoice = invoices()
    wrong = [
        ({"invoice_id": 1, "amount": "ten"}, "payload.amount"),
        ({"invoice_id": 1}, "payload.amount"),
        ({"invoice_id": 1, "amount": 5, "items": [{"sku": "a"}, {"sku": "b"}, {}]}, None),
        (None, "payload"),
        (Refund(invoice_id=1, amount=5), "payload"),
    ]
    for payload, field in wrong:
        field = field or "payload.items[2].sku"
        with pytest.raises(pgworker.ValidationError) as raised:
            await send_invoice.enqueue(conn, payload)
        assert raised.value.field == field, payload
        assert str(raised.value).startswith(f"{field}: ")
        with pytest.raises(pgworker.ValidationError) as raised:
            await registry.enqueue(conn, "send-invoice", payload)
        assert raised.value.field == field, payload
        with pytest.raises(pgworker.ValidationError) as raised:
            send_invoice.spec(payload)
        assert raised.value.field == field, payload
    assert "ten" not in str(raised.value)  # what was sent is never repeated
    assert await count(conn) == 0

    made = await send_invoice.enqueue(conn, Invoice(invoice_id=1, amount=5, items=[Item(sku="a")]))
    plain = await registry.enqueue(conn, "send-invoice", {"invoice_id": 2, "amount": 7})
    stored = json.loads(
        await conn.fetchval("SELECT payload FROM pgworker.jobs WHERE id = $1", made.job.id)
    )
    assert stored == {"invoice_id": 1, "amount": 5, "items": [{"sku": "a", "quantity": 1}]}
    assert plain.job.payload == {"invoice_id": 2, "amount": 7, "items": []}
    assert await count(conn) == 2


async def test_the_handler_receives_the_model_the_dataclass_and_the_typed_dict(dsn, conn) -> None:
    registry = pgworker.Registry()
    seen: dict[str, Any] = {}

    @registry.task("refund")
    async def refund(ctx: pgworker.JobContext, payload: Refund) -> None:
        seen["refund"] = (payload, ctx.payload)

    @registry.task("remind")
    def remind(ctx: pgworker.JobContext, payload: Reminder) -> None:  # a thread's handler too
        seen["remind"] = (payload, ctx.payload)

    @registry.task("receipt")
    async def receipt(ctx: pgworker.JobContext, payload: Receipt) -> None:
        seen["receipt"] = (payload, ctx.payload)

    # Version 1 had no amount: the upgrader fills it before the payload is decoded.
    @registry.task("refund-v2", version=2, upgrade={1: lambda p: {**p, "amount": 0}})
    async def refund_v2(ctx: pgworker.JobContext, payload: Refund) -> None:
        seen["refund-v2"] = (payload, ctx.payload)

    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    await refund.enqueue(conn, Refund(invoice_id=1, amount=5))
    await remind.enqueue(conn, Reminder(invoice_id=2, when=when))
    await receipt.enqueue(conn, {"invoice_id": 3, "email": "a@example.com"})
    await pgworker.enqueue(conn, "refund-v2", {"invoice_id": 4}, version=1)
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    assert seen["refund"] == (Refund(invoice_id=1, amount=5), {"invoice_id": 1, "amount": 5})
    assert seen["remind"][0] == Reminder(invoice_id=2, when=when)
    assert seen["remind"][1] == {"invoice_id": 2, "when": "2030-01-02T03:04:05Z"}
    assert seen["receipt"] == ({"invoice_id": 3, "email": "a@example.com"},) * 2
    assert seen["refund-v2"][0] == Refund(invoice_id=4, amount=0)
    assert await statuses(conn) == {"completed": 4}


async def test_a_stored_payload_that_no_longer_fits_fails_permanent_naming_the_path(
    dsn, conn
) -> None:
    registry = pgworker.Registry()
    ran: list[Any] = []

    @registry.task("refund", retry=RetryPolicy(max_retries=3, initial_delay=0.01))
    async def refund(ctx: pgworker.JobContext, payload: Refund) -> None:
        ran.append(payload)

    # Written before `amount` was added, by type (not through the handle): nothing checks it.
    old = await pgworker.enqueue(conn, "refund", {"invoice_id": 1})
    async with pgworker.Worker(registry, dsn, poll_interval=0.05):
        await wait_for(lambda: all_finished(conn))
    job = await pgworker.get_job(conn, old.job.id)
    assert (job.status, job.attempts, job.retry_count, job.max_retries) == ("failed", 1, 0, 3)
    assert job.error is not None and "payload.amount: Field required" in job.error
    assert "Refund" in job.error
    [attempt] = await attempts(conn, old.job.id)
    assert attempt["error_type"] == "InvalidPayload"
    assert ran == []


async def test_registry_enqueue_refuses_an_unknown_type_and_writes_nothing(conn) -> None:
    registry, _ = invoices()
    with pytest.raises(pgworker.ValidationError) as raised:
        await registry.enqueue(conn, "send-invoce", {"invoice_id": 1, "amount": 5})
    assert raised.value.field == "type"
    assert "did you mean 'send-invoice'" in str(raised.value)
    assert await count(conn) == 0


async def test_the_handle_applies_the_tasks_options_and_the_callers_win(conn) -> None:
    _, send_invoice = invoices()
    payload = {"invoice_id": 1, "amount": 5}
    made = (await send_invoice.enqueue(conn, payload)).job
    assert (made.queue, made.priority, made.max_retries, made.version) == ("billing", 20, 5, 2)
    given = await send_invoice.enqueue(
        conn, payload, queue="rush", priority=1, max_retries=0, version=1, idempotency_key="k"
    )
    row = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", given.job.id)
    assert (row["queue"], row["priority"], row["max_retries"], row["version"]) == ("rush", 1, 0, 1)
    assert row["idempotency_key"] == "k" and row["type"] == "send-invoice"
    spec = send_invoice.spec(payload, priority="low")
    assert spec == pgworker.JobSpec(
        "send-invoice", {**payload, "items": []}, "billing", "low", 5, version=2
    )


async def test_calling_the_handle_calls_the_handler(conn) -> None:
    registry, send_invoice = invoices()
    assert isinstance(send_invoice, pgworker.TaskHandle)
    assert await send_invoice(None, Invoice(invoice_id=1, amount=42)) == 42
    assert send_invoice.__name__ == "send_invoice" and send_invoice.__doc__ == "Send one invoice."
    assert send_invoice.__wrapped__ is registry["send-invoice"].fn
    assert send_invoice.name == "send-invoice" and send_invoice.task is registry["send-invoice"]
    assert registry["send-invoice"].payload_type is not None

    def plain(ctx: Any, payload: dict) -> int:
        return int(payload["n"]) + 1

    again = registry.task("plain")(plain)
    twice = registry.task("plain-too")(plain)
    stacked = registry.task("plain-three")(again)
    assert again(None, {"n": 1}) == twice(None, {"n": 1}) == stacked(None, {"n": 1}) == 2
    assert registry["plain"].fn is registry["plain-too"].fn is registry["plain-three"].fn is plain
    assert registry["plain"].payload_type is None  # dict: JSON as before
    assert await count(conn) == 0


async def test_enqueue_many_through_the_handle_writes_nothing_of_a_batch_with_one_bad_payload(
    conn,
) -> None:
    _, send_invoice = invoices()
    good = [{"invoice_id": n, "amount": n} for n in range(5)]
    bad = [*good[:3], {"invoice_id": 3, "amount": "x"}, good[4]]
    with pytest.raises(pgworker.ValidationError) as raised:
        await send_invoice.enqueue_many(conn, bad)
    assert raised.value.field == "payloads[3].amount"
    with pytest.raises(pgworker.ValidationError) as raised:
        await send_invoice.enqueue_many(conn, good, queue="")
    assert raised.value.field == "queue"
    assert await count(conn) == 0

    registry = pgworker.Registry()
    echo = registry.task("echo")(lambda ctx, payload: payload)
    with pytest.raises(pgworker.ValidationError) as raised:
        await echo.enqueue_many(conn, [{}, {"n": object()}])
    assert raised.value.field == "payloads[1]"
    assert await count(conn) == 0

    made = await send_invoice.enqueue_many(conn, [Invoice(**p) for p in good], priority=3)
    assert [r.job.payload["invoice_id"] for r in made] == list(range(5))
    rows = await conn.fetch(
        "SELECT DISTINCT queue, priority, max_retries, version FROM pgworker.jobs"
    )
    assert [tuple(r) for r in rows] == [("billing", 3, 5, 2)]


async def test_schemas_gives_each_types_payload_schema() -> None:
    schemas = typed_registry.schemas()
    assert schemas["echo"] == {}
    invoice = schemas["send-invoice"]
    assert invoice == pydantic.TypeAdapter(Invoice).json_schema()
    assert set(invoice["required"]) == {"invoice_id", "amount"}
    assert invoice["properties"]["amount"]["type"] == "integer"
    invoice["required"].clear()  # a copy: the registry's schema stays whole
    assert typed_registry.schemas()["send-invoice"]["required"]


async def test_registration_decides_once_what_a_payload_annotation_means(monkeypatch) -> None:
    registry = pgworker.Registry()
    for n, annotation in enumerate([dict, Any, "dict[str, Any]", list, int, None]):

        def handler(ctx: Any, payload: Any) -> None: ...

        handler.__annotations__ = {} if annotation is None else {"payload": annotation}
        registry.task(f"t{n}")(handler)
        assert registry[f"t{n}"].payload_type is None, annotation

    class Socketish:
        pass

    @dataclasses.dataclass
    class Unschemable:
        conn: Socketish

    def unschemable(ctx: Any, payload: Unschemable) -> None: ...

    unschemable.__annotations__["payload"] = Unschemable  # a local class: no string to resolve
    with pytest.raises(pgworker.ConfigError) as raised:
        registry.task("unschemable")(unschemable)
    assert "'unschemable'" in str(raised.value) and "test_registration" in str(raised.value)
    assert "cannot build a schema" in str(raised.value)

    def unresolved(ctx: Any, payload: NotDefinedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(pgworker.ConfigError, match="NotDefinedAnywhere"):
        registry.task("unresolved")(unresolved)

    def remind(ctx: Any, payload: Reminder) -> None: ...

    monkeypatch.setitem(sys.modules, "pydantic", None)  # `import pydantic` raises ImportError
    with pytest.raises(pgworker.ConfigError, match=r"pip install 'pgworker-queue\[pydantic\]'"):
        registry.task("remind")(remind)
    assert "remind" not in registry and "unschemable" not in registry


async def test_openapi_lists_each_types_payload_schema() -> None:
    document = create_app(WebConfig("postgresql://u@h/d", registry=typed_registry)).openapi()
    components = document["components"]["schemas"]
    invoice = components["Payload_send-invoice"]
    assert set(invoice["required"]) == {"invoice_id", "amount"}
    assert invoice["properties"]["items"]["items"] == {
        "$ref": "#/components/schemas/Payload_send-invoice.Item"
    }
    assert components["Payload_send-invoice.Item"]["required"] == ["sku"]
    assert components["Payload_echo"] == {"$ref": "#/components/schemas/JsonValue"}
    [rule] = components["EnqueueBody"]["allOf"]
    assert rule["if"]["properties"]["type"] == {"const": "send-invoice"}
    assert rule["then"]["properties"]["payload"] == {
        "$ref": "#/components/schemas/Payload_send-invoice"
    }
    # Left out, a payload is {}, which an Invoice is not: required for this type alone.
    assert rule["then"]["required"] == ["payload"]
    assert components["EnqueueBody"]["required"] == ["type"]
    without = create_app(WebConfig("postgresql://u@h/d")).openapi()["components"]["schemas"]
    assert not [k for k in without if k.startswith("Payload")]
    assert "allOf" not in without["EnqueueBody"]


async def test_http_enqueue_of_a_typed_type_checks_its_payload(dsn, conn) -> None:
    async with serving(dsn, "--app", "tests.apps.typed") as served, served.client() as c:
        document = (await c.get("/openapi.json")).json()
        assert "Payload_send-invoice" in document["components"]["schemas"]
        # As the document says, read as JSON Schema reads it: no "5" nor true for an integer.
        for amount in ["x", "5", True, 5.5, None]:
            wrong = await c.post(
                "/jobs",
                json={"type": "send-invoice", "payload": {"invoice_id": 1, "amount": amount}},
            )
            assert wrong.status_code == 422, wrong.text
            assert wrong.json()["field"] == "payload.amount"
        assert await count(conn) == 0
        made = await c.post(
            "/jobs", json={"type": "send-invoice", "payload": {"invoice_id": 1, "amount": 5.0}}
        )
        assert made.status_code == 201, made.text
        assert (made.json()["queue"], made.json()["priority"]) == ("billing", 20)
        assert made.json()["payload"] == {"invoice_id": 1, "amount": 5, "items": []}
        missing = await c.post("/jobs", json={"type": "send-invoice"})
        assert missing.status_code == 422 and missing.json()["field"].startswith("payload")
        # A type the registry does not know is enqueued as without one (served elsewhere).
        other = await c.post("/jobs", json={"type": "elsewhere", "payload": {"any": 1}})
        assert other.status_code == 201, other.text
    assert await count(conn) == 2
    assert typed_send_invoice.name == "send-invoice"


async def test_schemathesis_finds_nothing_against_the_payload_schemas(dsn, conn, tmp_path) -> None:
    """An independent client generates enqueue bodies from the document, typed payloads among
    them, valid and not: the server takes exactly what the document allows."""
    async with serving(dsn, "--app", "tests.apps.typed") as served:
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{served.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {served.token}",
            "--checks",
            "all",
            "--phases",
            "coverage,fuzzing",
            "--include-path-regex",
            "^/jobs$",
            "--include-method",
            "POST",
            # The bulk actions (POST too) would cancel and delete the jobs this test counts.
            "--exclude-path-regex",
            "^/jobs/actions",
            "--max-examples",
            "40",
            "--seed",
            "20",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ]
        with anyio.fail_after(300):
            done = await anyio.run_process(command, check=False, cwd=tmp_path)
        out = done.stdout.decode(errors="replace")
        assert done.returncode == 0, out[-8000:] + done.stderr.decode(errors="replace")[-2000:]
        assert "Traceback" not in served.stderr()
    typed = await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'send-invoice'")
    assert typed > 0  # the generated bodies reached the typed payload's schema


async def test_the_guides_example_runs(conn) -> None:
    """docs/guide/tasks.md's code, run as written."""
    text = (ROOT / "docs" / "guide" / "tasks.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", text, re.S)
    namespace: dict[str, Any] = {"__name__": "tasks_guide"}
    exec(compile(code, "docs/guide/tasks.md", "exec"), namespace)
    await namespace["checkout"](conn)
    rows = await conn.fetch("SELECT type, queue, priority, max_retries FROM pgworker.jobs")
    assert len(rows) == 103
    assert {tuple(r) for r in rows} == {("send-invoice", "billing", 20, 5)}
    assert namespace["registry"].schemas()["send-invoice"]["required"] == ["invoice_id", "amount"]
