"""The documented nesting limits hold at the limit, end to end: a plain payload nested
MAX_DEPTH (500) deep is stored, claimed, handed to its handler and read back, and one level more
is refused; a typed payload follows MAX_TYPED_DEPTH (200, what pydantic reads and validates)
the same way whether given as an instance or as a dict, and past it, however deep, is refused
with the same ValidationError naming `payload`, never pydantic's bare ValueError."""

from __future__ import annotations

from typing import Any, Optional

import asyncpg
import pydantic
import pytest

import pgworker
from pgworker import _validate as validate
from pgworker import sync
from pgworker.testing import drain

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Node(pydantic.BaseModel):
    child: Optional[Node] = None  # noqa: UP045 (pydantic resolves the forward reference)


def nested(depth: int) -> dict[str, Any]:
    """A JSON object nesting objects `depth` deep (`{}` is 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"child": value}
    return value


def node(depth: int) -> Node:
    value = Node()
    for _ in range(depth - 1):
        value = Node(child=value)
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict):
        depth, value = depth + 1, value.get("child")
    return depth


def _registry() -> tuple[pgworker.Registry, list[Any], Any, Any]:
    registry = pgworker.Registry()
    seen: list[Any] = []

    @registry.task("plain")
    async def plain(ctx: pgworker.JobContext, payload: Any) -> None:
        seen.append(payload)

    @registry.task("typed")
    async def typed(ctx: pgworker.JobContext, payload: Node) -> None:
        seen.append(payload)

    return registry, seen, plain, typed


async def test_a_plain_payload_at_the_limit_is_stored_claimed_and_read_back(
    conn: asyncpg.Connection,
) -> None:
    registry, seen, plain, _ = _registry()
    deepest = nested(validate.MAX_DEPTH)
    one = await pgworker.enqueue(conn, "plain", deepest)
    many = await pgworker.enqueue_many(conn, [pgworker.JobSpec("plain", deepest)])  # COPY
    scheduled = await pgworker.enqueue_many(conn, [pgworker.JobSpec("plain", deepest, delay=0)])
    handled = await plain.enqueue(conn, deepest)
    done = await drain(conn, registry)
    assert len(done.completed) == 4
    assert [depth_of(p) for p in seen] == [validate.MAX_DEPTH] * 4
    for result in (one, *many, *scheduled, handled):
        job = await pgworker.get_job(conn, result.job.id)
        assert job is not None and job.payload == deepest and job.status == "completed"


async def test_a_plain_payload_past_the_limit_is_refused_on_every_path(
    dsn: str, conn: asyncpg.Connection
) -> None:
    _, _, plain, _ = _registry()
    deeper = nested(validate.MAX_DEPTH + 1)
    message = f"must not nest lists and objects more than {validate.MAX_DEPTH} deep"
    attempts = [
        ("payload", pgworker.enqueue(conn, "plain", deeper)),
        ("payload", plain.enqueue(conn, deeper)),
        ("specs[0].payload", pgworker.enqueue_many(conn, [pgworker.JobSpec("plain", deeper)])),
        (
            "specs[0].payload",
            pgworker.enqueue_many(conn, [pgworker.JobSpec("plain", deeper, delay=0)]),
        ),
    ]
    for field, call in attempts:
        with pytest.raises(pgworker.ValidationError) as refused:
            await call
        assert refused.value.field == field and message in str(refused.value)
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as sync_conn:
        with pytest.raises(pgworker.ValidationError) as refused:
            sync.enqueue(sync_conn, "plain", deeper)
        assert refused.value.field == "payload"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0


@pytest.mark.parametrize("given", ["model", "dict"])
async def test_a_typed_payload_at_its_limit_is_stored_claimed_and_decoded(
    conn: asyncpg.Connection, given: str
) -> None:
    registry, seen, _, typed = _registry()
    depth = validate.MAX_TYPED_DEPTH
    payload = node(depth) if given == "model" else nested(depth)
    result = await typed.enqueue(conn, payload)
    spec = typed.spec(payload)
    (batched,) = await pgworker.enqueue_many(conn, [spec])
    assert len((await drain(conn, registry)).completed) == 2
    assert all(isinstance(p, Node) for p in seen) and len(seen) == 2
    assert [depth_of(p.model_dump(exclude_none=True)) for p in seen] == [depth, depth]
    for job_id in (result.job.id, batched.job.id):
        job = await pgworker.get_job(conn, job_id)
        assert job is not None and job.status == "completed"
        assert depth_of(job.payload) == depth


@pytest.mark.parametrize("given", ["model", "dict"])
@pytest.mark.parametrize(
    "depth", [validate.MAX_TYPED_DEPTH + 1, 256, 300, validate.MAX_DEPTH + 1, 2000]
)
async def test_a_typed_payload_past_its_limit_is_refused_alike_as_model_or_dict(
    conn: asyncpg.Connection, given: str, depth: int
) -> None:
    registry, _, _, typed = _registry()
    payload = node(depth) if given == "model" else nested(depth)
    said = f"must not nest lists and objects more than {validate.MAX_TYPED_DEPTH} deep"
    for field, call in (
        ("payload", lambda: typed.enqueue(conn, payload)),
        ("payload", lambda: registry.enqueue(conn, "typed", payload)),
        ("payloads[0]", lambda: typed.enqueue_many(conn, [payload])),
    ):
        with pytest.raises(pgworker.ValidationError) as refused:
            await call()
        assert refused.value.field == field, str(refused.value)
        assert said in str(refused.value)
    with pytest.raises(pgworker.ValidationError) as refused:
        typed.spec(payload)
    assert refused.value.field == "payload" and said in str(refused.value)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0


async def test_the_http_check_of_a_typed_payload_has_the_same_limit() -> None:
    """POST /jobs checks a typed payload as JSON (PayloadType.check_json): the same limit and
    error as from Python."""
    registry, _, _, _ = _registry()
    checked = registry["typed"].payload_type
    assert checked is not None
    checked.check_json(nested(validate.MAX_TYPED_DEPTH), "payload")
    for depth in (validate.MAX_TYPED_DEPTH + 1, 202, 300):
        with pytest.raises(pgworker.ValidationError) as refused:
            checked.check_json(nested(depth), "payload")
        assert refused.value.field == "payload"
        assert f"more than {validate.MAX_TYPED_DEPTH} deep" in str(refused.value)
