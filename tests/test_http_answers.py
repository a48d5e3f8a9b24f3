"""The HTTP API's answers tell the truth: never a 500 for a write that committed (deep
payloads and results, up to enqueue's nesting limit), every wait of `serve` bounded (a locked row,
a stalled database: 503 with Retry-After, and nothing applied later), a cancelled job that fails
ends cancelled, ids in paths are plain decimal integers, and no 422 echoes a secret."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import pgworker
from pgworker import _validate as validate

from .helpers import (
    PgProxy,
    attempts,
    cli,
    database_of,
    fake_claim,
    has_status,
    status_of,
    wait_for,
)
from .webserver import Served, server, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name

BOUND = 10.0
"""The README's promise: every request of `serve` is answered within 10 s."""


def nested(depth: int, leaf: Any = "leaf") -> Any:
    """`depth` lists and objects, one inside the other (objects and lists in turn)."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value, "i": i}
    return value


def same(a: Any, b: Any) -> bool:
    """Deep values compared by their JSON text (Python's == recurses on them)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


async def count_jobs(conn: Any) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgworker.jobs"))


def worker_body(job: dict[str, Any], worker_id: str = "w", **fields: Any) -> dict[str, Any]:
    return {"worker_id": worker_id, "attempt": job["attempt"], **fields}


# --- A: no 500 for a write that committed ------------------------------------------------------


@pytest.mark.parametrize("depth", [255, 256, 300, validate.MAX_DEPTH])
async def test_every_route_answers_a_deep_payload_or_result_whole(
    server: Served, conn: Any, depth: int
) -> None:
    """Past 255 levels pydantic's serialiser gave up after the write had committed: POST /jobs
    answered 500 for a job it had written (a retry without a key enqueues it twice), then
    GET /jobs and GET /jobs/{id} answered 500 for everyone, and complete, heartbeat, fail,
    cancel and replay changed the row and answered 500."""
    deep = nested(depth)
    async with server.client(timeout=60) as c:
        made = await c.post("/jobs", json={"type": "deep", "payload": deep})
        assert made.status_code == 201, made.text[:500]
        job = made.json()
        assert same(job["payload"], deep)
        one = await c.get(f"/jobs/{job['id']}")
        assert one.status_code == 200, one.text[:500]
        assert same(one.json()["payload"], deep)
        page = await c.get("/jobs")
        assert page.status_code == 200, page.text[:500]
        assert same(page.json()["jobs"][0]["payload"], deep)

        claimed = await c.post("/jobs/claim", json={"worker_id": "w", "types": ["deep"]})
        assert claimed.status_code == 200, claimed.text[:500]
        held = claimed.json()
        assert held["id"] == job["id"] and same(held["payload"], deep)
        beat = await c.post(f"/jobs/{job['id']}/heartbeat", json=worker_body(held))
        assert beat.status_code == 200, beat.text[:500]
        assert same(beat.json()["payload"], deep)
        result = nested(depth, leaf=42)
        done = await c.post(f"/jobs/{job['id']}/complete", json=worker_body(held, result=result))
        assert done.status_code == 200, done.text[:500]
        assert done.json()["status"] == "completed" and same(done.json()["result"], result)
        again = await c.get(f"/jobs/{job['id']}")
        assert again.status_code == 200 and same(again.json()["result"], result)

        # fail, cancel and replay of a job holding a deep payload
        second = (await c.post("/jobs", json={"type": "deep2", "payload": deep})).json()
        held = (await c.post("/jobs/claim", json={"worker_id": "w", "types": ["deep2"]})).json()
        failed = await c.post(
            f"/jobs/{second['id']}/fail", json=worker_body(held, error="E: no", permanent=True)
        )
        assert failed.status_code == 200, failed.text[:500]
        assert failed.json()["status"] == "failed" and same(failed.json()["payload"], deep)
        replayed = await c.post(f"/jobs/{second['id']}/replay")
        assert replayed.status_code == 200, replayed.text[:500]
        assert replayed.json()["status"] == "pending"
        cancelled = await c.post(f"/jobs/{second['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text[:500]
        assert cancelled.json()["cancel"] == "cancelled" and same(cancelled.json()["payload"], deep)
    assert await status_of(conn, second["id"]) == "cancelled"
    assert "Traceback" not in server.stderr()


async def test_one_level_past_the_limit_is_422_and_writes_nothing(
    server: Served, conn: Any
) -> None:
    too_deep = nested(validate.MAX_DEPTH + 1)
    async with server.client(timeout=60) as c:
        before = await count_jobs(conn)
        refused = await c.post("/jobs", json={"type": "deep", "payload": too_deep})
        assert refused.status_code == 422 and refused.json()["field"] == "payload", refused.text
        assert await count_jobs(conn) == before

        job = (await c.post("/jobs", json={"type": "t", "payload": {}})).json()
        held = (await c.post("/jobs/claim", json={"worker_id": "w"})).json()
        refused = await c.post(
            f"/jobs/{job['id']}/complete", json=worker_body(held, result=too_deep)
        )
        assert refused.status_code == 422 and refused.json()["field"] == "result", refused.text
    row = await conn.fetchrow("SELECT status, result FROM pgworker.jobs WHERE id = $1", job["id"])
    assert (row["status"], row["result"]) == ("running", None)
    assert [a["outcome"] for a in await attempts(conn, job["id"])] == ["running"]


async def test_json_deeper_than_the_limit_written_in_sql_is_unreadable_not_a_500(
    server: Served, conn: Any
) -> None:
    """One limit for what the API reads and writes: a row nested past it (written by SQL, 600
    deep, which Python still decodes) is shown null with `unreadable`, as a row Python cannot
    decode at all (5,000 deep); neither hides a page of GET /jobs from the others."""
    insert = "INSERT INTO pgworker.jobs (type, payload) VALUES ($1, $2::jsonb) RETURNING id"
    good = await conn.fetchval(insert, "t", "{}")
    over = await conn.fetchval(insert, "t", json.dumps(nested(600)))
    beyond = await conn.fetchval(insert, "t", "[" * 5000 + "]" * 5000)
    async with server.client(timeout=60) as c:
        page = await c.get("/jobs")
        assert page.status_code == 200, page.text[:500]
        jobs = {j["id"]: j for j in page.json()["jobs"]}
        assert set(jobs) == {good, over, beyond}
        for poison in (over, beyond):
            assert jobs[poison]["payload"] is None and "payload" in jobs[poison]["unreadable"]
            one = await c.get(f"/jobs/{poison}")
            assert one.status_code == 200, one.text[:500]
            assert one.json()["payload"] is None
        assert str(validate.MAX_DEPTH) in jobs[over]["unreadable"]["payload"]
        assert jobs[good]["payload"] == {} and "unreadable" not in jobs[good]


# --- D: every wait bounded ---------------------------------------------------------------------


async def serve_idle(conn: Any) -> bool:
    """No statement of `serve` is running (one waiting on a lock would be)."""
    busy = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgworker:serve%' "
        "AND state <> 'idle' AND pid <> pg_backend_pid() AND datname = current_database()"
    )
    return busy == 0


def assert_unavailable(r: httpx.Response, took: float) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"] and "Traceback" not in r.text
    assert took < BOUND, f"answered after {took:.1f}s"


async def timed(c: httpx.AsyncClient, method: str, path: str, **kw: Any) -> tuple[Any, float]:
    start = time.monotonic()
    try:
        r: Any = await c.request(method, path, **kw)
    except httpx.TimeoutException as exc:
        r = exc
    return r, time.monotonic() - start


async def test_a_locked_job_is_answered_503_in_time_and_never_changed_later(
    dsn: str, server: Served, conn: Any
) -> None:
    """While another session held the job's row lock, cancel and complete never answered, and
    both were applied once the lock was released (the job completed with a cancel request)."""
    async with server.client(timeout=30) as c:
        job = (await c.post("/jobs", json={"type": "t", "payload": {}})).json()
        held = (await c.post("/jobs/claim", json={"worker_id": "w"})).json()
        locker = await asyncpg.connect(dsn)
        try:
            tx = locker.transaction()
            await tx.start()
            await locker.execute("SELECT 1 FROM pgworker.jobs WHERE id = $1 FOR UPDATE", job["id"])
            answers: dict[str, tuple[Any, float]] = {}

            async def send(name: str, path: str, body: Any) -> None:
                answers[name] = await timed(c, "POST", path, json=body)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "cancel", f"/jobs/{job['id']}/cancel", None)
                tg.start_soon(send, "complete", f"/jobs/{job['id']}/complete", worker_body(held))
            await tx.rollback()
        finally:
            await locker.close()
        for name in ("cancel", "complete"):
            r, took = answers[name]
            assert isinstance(r, httpx.Response), f"{name}: no answer within 30 s ({r!r})"
            assert_unavailable(r, took)
            assert "locked by another session" in r.json()["error"], r.text
        await wait_for(lambda: serve_idle(conn), timeout=30)
        row = await conn.fetchrow(
            "SELECT status, cancel_requested_at FROM pgworker.jobs WHERE id = $1", job["id"]
        )
        assert (row["status"], row["cancel_requested_at"]) == ("running", None)
        assert [a["outcome"] for a in await attempts(conn, job["id"])] == ["running"]
        # The attempt still holds its job, and finishes it now that nothing is in the way.
        done = await c.post(f"/jobs/{job['id']}/complete", json=worker_body(held))
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text


async def test_a_stalled_database_is_answered_503_in_time_and_nothing_is_written(
    dsn: str, conn: Any
) -> None:
    """With the database stalled, GET /queues and POST /jobs hung past 60 s (while /healthz said
    503 in 5 s)."""
    async with PgProxy(dsn) as proxy, serving(proxy.dsn) as served:
        async with served.client(timeout=30) as c:
            first = await c.post("/jobs", json={"type": "t", "payload": {"n": 0}})
            assert first.status_code == 201, first.text
            assert (await c.get("/queues")).status_code == 200
            proxy.stall()
            answers: dict[str, tuple[Any, float]] = {}

            async def send(name: str, method: str, path: str, body: Any = None) -> None:
                answers[name] = await timed(c, method, path, json=body)

            async with anyio.create_task_group() as tg:
                tg.start_soon(send, "queues", "GET", "/queues")
                tg.start_soon(send, "jobs", "GET", "/jobs")
                tg.start_soon(send, "enqueue", "POST", "/jobs", {"type": "stalled", "payload": {}})
                tg.start_soon(send, "claim", "POST", "/jobs/claim", {"worker_id": "w"})
            for name, (r, took) in answers.items():
                assert isinstance(r, httpx.Response), f"{name}: no answer within 30 s ({r!r})"
                assert_unavailable(r, took)
            proxy.resume()

            async def healthy() -> bool:
                return (await c.get("/healthz")).status_code == 200

            await wait_for(healthy, timeout=30)
            await wait_for(lambda: serve_idle(conn), timeout=30)
            assert (
                await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE type = 'stalled'")
                == 0
            )
            assert await status_of(conn, first.json()["id"]) == "pending"
            after = await c.post("/jobs", json={"type": "t", "payload": {"n": 1}})
            assert after.status_code == 201, after.text
        assert "Traceback" not in served.stderr()


# --- F: cancel means cancelled -----------------------------------------------------------------


@pytest.mark.parametrize(("permanent", "retries"), [(True, 3), (False, 0), (False, 3)])
async def test_a_cancelled_http_job_that_fails_ends_cancelled_and_stays_so(
    dsn: str, server: Served, conn: Any, permanent: bool, retries: int
) -> None:
    """An operator cancels a job an HTTP worker runs; its heartbeat says cancel_requested; the
    worker gives up with `fail`: the job ended failed (permanent, or no retry left), and
    `pgworker replay --type` put it back to pending."""
    async with server.client() as c:
        job = (
            await c.post("/jobs", json={"type": "T", "payload": {}, "max_retries": retries})
        ).json()
        held = (await c.post("/jobs/claim", json={"worker_id": "w"})).json()
        asked = await c.post(f"/jobs/{job['id']}/cancel")
        assert asked.json()["cancel"] == "cancelling", asked.text
        beat = await c.post(f"/jobs/{job['id']}/heartbeat", json=worker_body(held))
        assert beat.json()["cancel_requested"] is True, beat.text
        failed = await c.post(
            f"/jobs/{job['id']}/fail",
            json=worker_body(held, error="Stopped: asked to", permanent=permanent),
        )
        assert failed.status_code == 200, failed.text
        assert failed.json()["status"] == "cancelled", failed.text
        assert failed.json()["retry_count"] == 0
    assert [a["outcome"] for a in await attempts(conn, job["id"])] == ["cancelled"]
    replayed = await anyio.to_thread.run_sync(lambda: cli("replay", "--type", "T", "--dsn", dsn))
    assert replayed.returncode == 0, replayed.stderr
    assert await status_of(conn, job["id"]) == "cancelled"


@pytest.mark.parametrize("failure", ["permanent", "last-retry", "timeout"])
async def test_a_python_handler_that_fails_for_good_after_a_cancel_request_ends_cancelled(
    dsn: str, conn: Any, failure: str
) -> None:
    """The cancel is asked for while the handler runs, before its worker hears of it (no LISTEN,
    the next heartbeat far off); the handler then fails for good (PermanentError, its last retry,
    its timeout): the job ended failed, and `replay --type` ran it again."""
    registry = pgworker.Registry()
    asked = anyio.Event()
    runs: list[int] = []

    @registry.task("T", max_retries=0, timeout=2.0 if failure == "timeout" else 60.0)
    async def handle(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        runs.append(ctx.attempt)
        await asked.wait()
        if failure == "permanent":
            raise pgworker.PermanentError("gave up")
        if failure == "timeout":
            await anyio.sleep_forever()
        raise ValueError("boom")

    r = await pgworker.enqueue(conn, "T", {})
    worker = pgworker.Worker(registry, dsn, listen=False, lease=60.0, poll_interval=0.05)
    async with worker:
        await wait_for(lambda: runs, timeout=30)
        assert await pgworker.cancel(conn, r.job.id) == "cancelling"
        asked.set()

        async def finished() -> bool:
            return await status_of(conn, r.job.id) not in ("pending", "running")

        await wait_for(finished, timeout=30)
    job = await pgworker.get_job(conn, r.job.id)
    assert job is not None and (job.status, runs, job.retry_count) == ("cancelled", [1], 0)
    assert [a["outcome"] for a in await attempts(conn, r.job.id)] == ["cancelled"]
    done = await pgworker.replay(conn, type="T")
    assert done.replayed == () and await status_of(conn, r.job.id) == "cancelled"


# --- J: strict ids in paths; no secret echoed in a 422 -----------------------------------------

NOT_IDS = ["1.0", "%201", "%20 1", "1%20", "+1", "%2B1", "1e0", "%EF%BC%90%EF%BC%91", "1_0"]


async def test_a_job_id_in_a_path_is_plain_ascii_decimal(server: Served) -> None:
    """`GET /jobs/1.0` and `GET /jobs/%20 1` returned job 1."""
    async with server.client() as c:
        for n in range(12):
            await c.post("/jobs", json={"type": "t", "payload": {"n": n}})
        assert (await c.get("/jobs/1")).status_code == 200
        assert (await c.get("/jobs/10")).status_code == 200
        for raw in NOT_IDS:
            for method, path in [
                ("GET", f"/jobs/{raw}"),
                ("POST", f"/jobs/{raw}/cancel"),
                ("POST", f"/jobs/{raw}/replay"),
            ]:
                url = httpx.URL(server.url).copy_with(raw_path=path.encode())
                r = await c.request(method, url)
                assert r.status_code == 422, (path, r.status_code, r.text)
                body = r.json()
                assert body["field"] == "id" and "digits" in body["error"], (path, body)


SECRET = "sk_live_51Habc9XyZsecretvalue"


async def test_no_422_echoes_what_was_sent(server: Served, conn: Any) -> None:
    """A secret sent as a priority label came back in the 422's text."""
    refused: list[tuple[str, dict[str, Any], str]] = [
        ("/jobs", {"type": "t", "payload": {}, "priority": SECRET}, "priority"),
        ("/jobs", {"type": "t", "payload": {}, "priority": [SECRET]}, "priority"),
        ("/jobs", {"type": "t", "payload": {}, "max_retries": SECRET}, "max_retries"),
        ("/jobs", {"type": "t", "payload": {}, "run_at": SECRET}, "run_at"),
        ("/jobs", {"type": "t", "payload": {}, "delay": SECRET}, "delay"),
        ("/jobs", {"type": "t", "payload": {}, "version": SECRET}, "version"),
        ("/jobs", {"type": SECRET * 10, "payload": {}}, "type"),
        ("/jobs", {"type": "t", "payload": {}, "queue": SECRET * 3}, "queue"),
        ("/jobs", {"type": "t", "payload": {}, "idempotency_key": SECRET * 20}, "idempotency_key"),
        ("/jobs", {"type": "t", "payload": {}, "correlation_id": SECRET * 10}, "correlation_id"),
        ("/jobs", {"type": [SECRET], "payload": {}}, "type"),
        ("/jobs/claim", {"worker_id": SECRET * 10}, "worker_id"),
        ("/jobs/claim", {"worker_id": "w", "lease": SECRET}, "lease"),
        ("/jobs/claim", {"worker_id": "w", "types": SECRET}, "types"),
        ("/jobs/claim", {"worker_id": "w", "versions": {"t": [SECRET]}}, "versions"),
        ("/jobs/claim", {"worker_id": "w", "versions": {SECRET: []}}, "versions"),
        ("/jobs/1/fail", {"worker_id": "w", "attempt": 1, "error": [SECRET]}, "error"),
        ("/jobs/1/fail", {"worker_id": "w", "attempt": SECRET, "error": "e"}, "attempt"),
        ("/jobs/1/replay", {"by": SECRET * 10}, "by"),
    ]
    async with server.client() as c:
        await c.post("/jobs", json={"type": "t", "payload": {}})
        for path, body, field in refused:
            r = await c.post(path, json=body)
            assert r.status_code == 422 and r.json()["field"] == field, (body, r.text)
            assert "sk_live" not in r.text and "secretvalue" not in r.text, (body, r.text)
        priority = await c.post("/jobs", json={"type": "t", "payload": {}, "priority": SECRET})
        assert "low, medium, high" in priority.json()["error"], priority.text
        for query in [f"status={SECRET}", f"limit={SECRET}", f"before={SECRET}"]:
            r = await c.get(f"/jobs?{query}")
            assert r.status_code == 422 and SECRET not in r.text, r.text
        r = await c.get(f"/jobs/{SECRET}")
        assert r.status_code == 422 and SECRET not in r.text, r.text
    assert await count_jobs(conn) == 1


# --- serve: killed connections, clients leaving, large or undecodable jobs, a read-only server


@pytest.mark.asyncio(loop_scope="session")
async def test_serve_recovers_when_its_connections_are_killed_never_dropping_a_client(dsn, conn):
    """pg_terminate_backend of serve's connections while requests run: asyncpg's
    InternalClientError reached the Exception handler, whose answer Starlette re-raises; uvicorn
    logged a traceback (with the bearer token among its locals) and closed the client's
    connection, so the next request on it failed with a ReadError."""
    async with serving(dsn) as served:
        async with served.client(timeout=30) as client:
            seen: list[object] = []
            for _ in range(4):
                await asyncio.gather(*(client.get("/jobs") for _ in range(12)))
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'pgworker:serve%' AND datname = $1",
                    database_of(dsn),
                )
                for i in range(6):
                    answers = await asyncio.gather(
                        client.get("/jobs"),
                        client.post("/jobs", json={"type": "t", "payload": i}),
                        client.get("/queues"),
                        client.get("/workers"),
                        client.get("/jobs/1"),
                        return_exceptions=True,
                    )
                    seen += [getattr(a, "status_code", a) for a in answers]
            assert all(s in (200, 201, 404, 503) for s in seen), seen
            assert (await client.get("/jobs")).status_code == 200
        log = served.stderr()
    assert served.token not in log
    assert "Exception in ASGI application" not in log


@pytest.mark.asyncio(loop_scope="session")
async def test_clients_that_leave_mid_body_leave_no_traceback_in_the_log(dsn, capsys, caplog):
    """A POST whose client disconnects before the end of its body: the dashboard's form (the
    login, which needs no token) logged two error tracebacks each time, so anyone could fill
    serve's log with them. The application is called as uvicorn calls it, so that the test knows
    when the request has been dealt with (the call returns): uvicorn logs its traceback ("Exception
    in ASGI application") exactly when that call raises."""
    from pgworker._web.app import create_app
    from pgworker._web.config import WebConfig

    app = create_app(WebConfig(dsn=dsn, tokens=("token",)))
    # Its lifespan, as uvicorn runs it: the pool and the bulk runner closed at the end.
    async with app.router.lifespan_context(app):
        for path, kind in [
            ("/ui/login", b"application/x-www-form-urlencoded"),
            ("/jobs", b"application/json"),
        ]:
            left, sent = await _leave_mid_body(app, path, kind)
            assert left == 1, "the application did not read the body"
            assert all(m.get("status", 400) < 500 for m in sent), sent
    logged = capsys.readouterr()
    assert "Traceback" not in logged.out + logged.err and "[error" not in logged.out + logged.err
    assert [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def _leave_mid_body(app: Any, path: str, kind: bytes) -> tuple[int, list[dict[str, Any]]]:
    """POST `path` to the application as uvicorn does, the client leaving after 8 of the 100
    bytes it announced; returns the messages left unread (the disconnect) and those sent. The
    call raising is what uvicorn logs a traceback for."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"csrf=abc", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if len(messages) > 1 else messages[0]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", b"Bearer token"),
            (b"content-type", kind),
            (b"content-length", b"100"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return len(messages), sent


@pytest.mark.asyncio(loop_scope="session")
async def test_a_page_of_large_jobs_is_cut_by_its_size_and_the_pages_still_list_every_job(
    dsn, conn
):
    """GET /jobs?limit=1000 read a thousand jobs whole, payloads and results of up to 64 MB each:
    one request could hold gigabytes in serve's memory. A page now ends at about 8 MB of JSON,
    with a next_before, and following the pages lists every job once."""
    big = "x" * (3 * 1024 * 1024)
    made = [(await pgworker.enqueue(conn, "big", {"blob": big, "n": i})).job.id for i in range(12)]
    small = [(await pgworker.enqueue(conn, "small", {"n": i})).job.id for i in range(5)]
    async with serving(dsn) as served, served.client(timeout=60) as client:
        first = await client.get("/jobs", params={"limit": 1000})
        assert first.status_code == 200
        assert len(first.content) < 16 * 1024 * 1024
        seen: list[int] = []
        page = first.json()
        while True:
            assert page["jobs"], page
            seen += [j["id"] for j in page["jobs"]]
            if page["next_before"] is None:
                break
            answer = await client.get(
                "/jobs", params={"limit": 1000, "before": page["next_before"]}
            )
            assert answer.status_code == 200 and len(answer.content) < 16 * 1024 * 1024
            page = answer.json()
        assert seen == sorted(made + small, reverse=True)
        only = await client.get("/jobs", params={"type": "small", "limit": 5})
        assert [j["id"] for j in only.json()["jobs"]] == small[::-1]


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.asyncio(loop_scope="session")
async def test_a_job_python_cannot_decode_hides_neither_a_page_nor_itself_nor_the_next_claim(
    dsn, conn
):
    """One such job made GET /jobs answer 409 for every page it was on (nobody could list the
    jobs), GET /jobs/{id} of a job with such a result or milestone 500, and every HTTP claim
    that took it 409 (the job left running till its lease ran out, then claimed again)."""
    insert = "INSERT INTO pgworker.jobs (type, payload) VALUES ($1, $2::jsonb) RETURNING id"
    good = await conn.fetchval(insert, "t", "{}")
    poison = await conn.fetchval(insert, "t", DEEP)
    done = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, payload, status, result, finished_at) "
        "VALUES ('u', '{}', 'completed', $1::jsonb, now()) RETURNING id",
        DEEP,
    )
    await conn.execute(
        "INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail) "
        "VALUES ($1, 1, 'm', $2::jsonb)",
        done,
        DEEP,
    )
    async with serving(dsn) as served, served.client(timeout=60) as client:
        listed = await client.get("/jobs")
        assert listed.status_code == 200, listed.text
        assert [j["id"] for j in listed.json()["jobs"]] == [done, poison, good]
        shown = (await client.get(f"/jobs/{poison}")).json()
        assert shown["payload"] is None and "RecursionError" in shown["unreadable"]["payload"]
        shown = await client.get(f"/jobs/{done}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["result"] is None and shown.json()["milestones"][0]["detail"] is None
        claims = []
        for _ in range(3):
            answer = await client.post("/jobs/claim", json={"worker_id": "w", "types": ["t"]})
            assert answer.status_code in (200, 204), answer.text
            claims.append(answer.json()["id"] if answer.status_code == 200 else None)
        assert claims == [good, None, None]
    row = await conn.fetchrow("SELECT status, error FROM pgworker.jobs WHERE id = $1", poison)
    assert row["status"] == "failed" and row["error"].startswith("InvalidPayload: ")


@pytest.mark.asyncio(loop_scope="session")
async def test_an_http_worker_can_fail_its_job_when_a_column_of_it_cannot_be_decoded(dsn, conn):
    """Its milestone written deep by SQL while it ran: `fail` decoded the whole row first and
    answered 409, so the worker could not end its attempt."""
    async with serving(dsn) as served, served.client(timeout=60) as client:
        await client.post("/jobs", json={"type": "t", "payload": {"a": 1}})
        claimed = (await client.post("/jobs/claim", json={"worker_id": "w"})).json()
        await conn.execute(
            "UPDATE pgworker.jobs SET progress = $2::jsonb WHERE id = $1", claimed["id"], DEEP
        )
        body = {
            "worker_id": "w",
            "attempt": claimed["attempt"],
            "error": "E: no",
            "permanent": True,
        }
        failed = await client.post(f"/jobs/{claimed['id']}/fail", json=body)
        assert failed.status_code == 200, failed.text
        assert failed.json()["status"] == "failed" and "progress" in failed.json()["unreadable"]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_read_only_server_writes_nothing_not_even_maintenance(dsn, conn):
    """`serve --read-only` ("reads only", says the README) still led maintenance: it took the
    leader row, rescued and pruned (deleted) jobs; on a database role that may only read, it
    logged a traceback of `permission denied` over and over."""
    role = f"pgw_reader_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await conn.execute(
            f"GRANT USAGE ON SCHEMA pgworker TO {role}; "
            f"GRANT SELECT ON ALL TABLES IN SCHEMA pgworker TO {role}"
        )
        expired = (await pgworker.enqueue(conn, "t", {})).job.id
        await fake_claim(conn, expired, worker_id="gone", lease_s=-60)
        reader = dsn.replace("postgres@", f"{role}@", 1)
        fast = {"PGWORKER_LEASE": "1"}  # maintenance, were it on, would tick every 0.5 s
        async with serving(reader, "--read-only", env=fast) as served, served.client() as client:
            assert (await client.get("/jobs")).status_code == 200
            # Maintenance starts with the server, before it answers, and tries to lead at once.
            # A witness started after that (a worker with maintenance, the same 1 s lease) leads
            # and rescues the expired job: by then the server's first tick, were there one, has
            # come and gone, and a read-only role's attempt to lead is `permission denied`.
            witness = pgworker.Registry()
            witness.task("elsewhere-only", queue="elsewhere")(_nothing)
            async with pgworker.Worker(witness, dsn, worker_id="witness", lease=1.0):
                await wait_for(lambda: has_status(conn, expired, "pending"), timeout=30)
                assert await conn.fetchval("SELECT worker_id FROM pgworker.leader") == "witness"
            assert (await client.get("/jobs")).status_code == 200
            log = served.stderr()
        assert "permission denied" not in log and "Traceback" not in log, log
    finally:
        await conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


async def _nothing(ctx: pgworker.JobContext, payload: Any) -> None:
    return None


# --- a body sent a byte at a time; ids with a leading zero -----------------------------------


BODY_BOUND = 30.0


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
