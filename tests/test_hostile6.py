"""Issue 20, the hostile round after its fixes: what a hostile user or operator still got through.

- A transactional step's guard counted CASEs and ENDs to find the end of a `BEGIN ATOMIC` body
  (psql's rule), and took `begin, atomic` for one: `x.case`, `1 AS case`, a bare `case` label or
  `SET search_path = begin, atomic` let a COMMIT (or END) after the CREATE FUNCTION pass for part
  of it, and the step's effect committed alone. So did a COMMIT after a -- comment ended by a
  carriage return (PostgreSQL ends it there; the guard read on to the next newline).
- `pgworker serve` waited without end for a request's body: one byte a second held a connection
  and a task for as long as the client liked (also the 413's drain of a refused body).
- `GET /jobs/01` answered job 1 and `POST /jobs/01/cancel` cancelled it; the README refuses `01`.
- pgworker_jobs_total counted `retried` for an attempt its row says `cancelled` (a job cancelled
  while its handler failed).
- An HTTP heartbeat skipped by a row lock answered 200 as if it had extended the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import ValidationError
from pgworker._steps.connection import transaction_control

from .helpers import attempts, status_of, wait_for
from .test_metrics import free_port, scrape
from .test_steps import contexts, step_rows  # noqa: F401  (the fixture)
from .webserver import Served, server

__all__ = ["server"]  # the fixture, used by name

pytestmark = pytest.mark.asyncio(loop_scope="session")

BODY_BOUND = 30.0
"""The README's promise: a body arrives whole within 30 s, or its request is answered 408."""
ROUTINE = "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql "

# --- a BEGIN ATOMIC body ends at its END, whatever CASE and END words it holds; a -- comment at
# a carriage return ------------------------------------------------------------------------

ESCAPES = {
    "attribute named case": ROUTINE + "BEGIN ATOMIC SELECT x.case FROM (SELECT 1 AS case) x; "
    "END; COMMIT",
    "label after AS": ROUTINE + "BEGIN ATOMIC SELECT 1 AS case; END; COMMIT",
    "bare label": ROUTINE + "BEGIN ATOMIC SELECT 1 case; END; COMMIT",
    "end as a label": ROUTINE + "BEGIN ATOMIC SELECT 1 AS end; END; COMMIT",
    "begin, atomic is no body": ROUTINE + "SET search_path = begin, atomic AS 'select 1'; END",
    # PostgreSQL ends a -- comment at a carriage return as at a newline
    "comment ended by CR": "SELECT 1 -- c\r; COMMIT",
    "comment ended by CR in a body": ROUTINE + "BEGIN ATOMIC SELECT 1; -- c\rEND; COMMIT",
}


@pytest.mark.parametrize("sql", list(ESCAPES.values()), ids=list(ESCAPES))
async def test_a_commit_after_a_body_or_a_comment_is_found(sql: str) -> None:
    assert transaction_control(sql) in ("COMMIT", "END")


@pytest.mark.parametrize(
    "sql",
    [
        ROUTINE + "BEGIN ATOMIC SELECT x.case FROM (SELECT 1 AS case) x; END",
        ROUTINE + "BEGIN /* c */ ATOMIC SELECT 1 end; END; SELECT 1",
        ROUTINE + "BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; "
        "SELECT (CASE WHEN true THEN 2 END); END; SELECT 1",
        ROUTINE + "BEGIN ATOMIC END",
        "SELECT 1 -- c; COMMIT\r\nSELECT 2",
    ],
)
async def test_a_begin_atomic_body_with_case_and_end_words_is_sent(sql: str) -> None:
    assert transaction_control(sql) is None


@pytest.mark.parametrize("sql", list(ESCAPES.values()), ids=list(ESCAPES))
async def test_a_step_cannot_commit_after_a_routine_or_a_comment(
    contexts: Any,  # noqa: F811
    conn: Any,
    sql: str,
) -> None:
    """Sent, each text commits the step's transaction (PostgreSQL reads the body by its grammar):
    the step's effect would stay without its checkpoint, and its retry would make it again."""
    await conn.execute("CREATE TABLE effects (n int)")
    ctx = await contexts.new()

    async def write(c: Any) -> None:
        await c.execute("INSERT INTO effects VALUES (1)")
        await c.execute(sql)

    with pytest.raises(ValidationError, match=r"sent (COMMIT|END) "):
        await ctx.transactional_step("routine", write)
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0
    assert await step_rows(conn, ctx.job_id) == []


async def test_a_step_creates_a_routine_whose_body_names_case_and_end(
    contexts: Any,  # noqa: F811
    conn: Any,
) -> None:
    ctx = await contexts.new()

    async def write(c: Any) -> int:
        await c.execute(
            ROUTINE + "BEGIN ATOMIC SELECT x.case + x.end FROM (SELECT 1 AS case, 2 AS end) x; END"
        )
        return int(await c.fetchval("SELECT pg_temp.f()"))

    assert await ctx.transactional_step("routine", write) == 3
    assert [s["name"] for s in await step_rows(conn, ctx.job_id)] == ["routine"]


# --- a request's body arrives within a bound ------------------------------------------------


async def test_a_body_sent_a_byte_at_a_time_is_answered_408_and_closed(server: Served) -> None:
    """A client that announced 100 bytes and sent one a second held its connection and a task
    of the server for as long as it liked, answered never: 60 s later it was still open."""
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + server.token.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    started = time.monotonic()
    answer = b""

    async def trickle() -> None:
        # Until 2 s before the bound: a byte the server has not read when it closes would turn
        # its close into a reset, which can drop the answer before this client reads it.
        with contextlib.suppress(OSError):
            for _ in range(int(BODY_BOUND) - 2):
                await anyio.sleep(1)
                writer.write(b" ")
                await writer.drain()

    async with anyio.create_task_group() as tg:
        tg.start_soon(trickle)
        with anyio.move_on_after(BODY_BOUND + 30):
            answer = await reader.read()  # to the end: the server closes the connection
        tg.cancel_scope.cancel()
    writer.close()
    waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), (waited, answer[:300])
    assert b"did not arrive within 30 s" in answer
    assert waited < BODY_BOUND + 30


# --- metrics count the outcome the database recorded -----------------------------------------


@pytest.mark.parametrize("ends", ["fails", "completes"])
async def test_metrics_count_a_cancelled_attempt_as_its_row_says(
    dsn: str, conn: Any, ends: str
) -> None:
    """The handler of a job an operator cancels fails before a heartbeat tells it: the database
    ends the job and its attempt `cancelled` (job_finish_many.sql), and pgworker_jobs_total said
    `retried`. A completion stays completed on both sides."""
    registry = pgworker.Registry()
    started, go = asyncio.Event(), asyncio.Event()

    @registry.task("slow", retry=pgworker.RetryPolicy(max_retries=3, initial_delay=60))
    async def slow(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        started.set()
        await go.wait()
        if ends == "fails":
            raise RuntimeError("failed after the cancel request")

    r = await pgworker.enqueue(conn, "slow", {})
    port = free_port()
    # A lease of 10 minutes and no LISTEN: neither a heartbeat nor a notification tells the
    # handler of the cancel before it ends.
    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=600, listen=False):
        await asyncio.wait_for(started.wait(), 30)
        assert await pgworker.cancel(conn, r.job.id) == "cancelling"
        go.set()
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status <> 'running' FROM pgworker.jobs WHERE id = $1", r.job.id
            ),
            timeout=30,
        )
        rows = [a["outcome"] for a in await attempts(conn, r.job.id)]
        wanted = {"fails": "cancelled", "completes": "completed"}[ends]
        assert rows == [wanted]
        assert await status_of(conn, r.job.id) == wanted

        def counted() -> dict[str, float] | None:
            found = {
                dict(labels)["outcome"]: v
                for (name, labels), v in scrape(port).items()
                if name == "pgworker_jobs_total" and v
            }
            return found or None

        assert await wait_for(counted, timeout=30) == {wanted: 1.0}


# --- a job's id in a path has one spelling --------------------------------------------------


async def test_an_id_with_a_leading_zero_names_no_job(server: Served, conn: Any) -> None:
    """The README lists `01` among the ids that name no job (422 naming `id`); `GET /jobs/01`
    answered job 1, and `POST /jobs/01/cancel` cancelled it."""
    r = await pgworker.enqueue(conn, "t", {})
    assert r.job.id == 1
    async with server.client() as c:
        for raw in ["01", "001", "00", "-01"]:
            for method, path in [
                ("GET", f"/jobs/{raw}"),
                ("POST", f"/jobs/{raw}/cancel"),
                ("POST", f"/jobs/{raw}/replay"),
            ]:
                answer = await c.request(method, path)
                assert answer.status_code == 422, (path, answer.status_code, answer.text)
                body = answer.json()
                assert body["field"] == "id" and "digits" in body["error"], (path, body)
        assert (await c.get("/jobs?before=01")).status_code == 422
        assert (await c.get("/jobs/1")).status_code == 200
    assert await status_of(conn, r.job.id) == "pending"


# --- an HTTP heartbeat says whether it extended the lease -----------------------------------


async def test_a_heartbeat_that_could_not_extend_the_lease_says_so(
    server: Served, conn: Any, dsn: str
) -> None:
    """Another session holds the job's row locked: the heartbeat skips it (as the Python
    worker's does), and answered 200 with the claim's lease, as if extended. Now: 503 with
    Retry-After, nothing changed; once the lock is gone, 200 and the lease extended."""
    async with server.client(timeout=60) as c:
        await c.post("/jobs", json={"type": "beat", "payload": {}})
        claimed = (
            await c.post("/jobs/claim", json={"worker_id": "w", "types": ["beat"], "lease": 5})
        ).json()
        body = {"worker_id": "w", "attempt": claimed["attempt"], "lease": 600}
        path = f"/jobs/{claimed['id']}/heartbeat"
        lease = "SELECT lease_expires_at, heartbeat_at FROM pgworker.jobs WHERE id = $1"
        before = await conn.fetchrow(lease, claimed["id"])
        other = await asyncpg.connect(dsn)
        try:
            async with other.transaction():
                await other.execute(
                    "SELECT FROM pgworker.jobs WHERE id = $1 FOR UPDATE", claimed["id"]
                )
                beat = await c.post(path, json=body)
                assert beat.status_code == 503, beat.text
                assert beat.headers["Retry-After"] == "2"
                assert "lease was not extended" in beat.json()["error"]
        finally:
            await other.close()
        assert await conn.fetchrow(lease, claimed["id"]) == before
        beat = await c.post(path, json=body)
        assert beat.status_code == 200, beat.text
        assert beat.json()["lease_expires_at"] > claimed["lease_expires_at"]
