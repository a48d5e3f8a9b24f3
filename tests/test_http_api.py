"""The HTTP API over real HTTP against a real `pgworker serve` (uvicorn on 127.0.0.1, a free
port): every status the issue lists, the claim -> heartbeat -> complete and claim -> fail paths,
fencing of stale attempts, concurrent claims, auth, --read-only, the body limit, the rescue of a
job whose HTTP worker vanished, and hostile input."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

import anyio
import asyncpg
import httpx
import pytest

import pgworker
from pgworker._version import DISTRIBUTION

from .helpers import ROOT, attempts, database_of, status_of, wait_for
from .webserver import TOKEN, Served, run_serve, server, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name

JOB_KEYS = set(pgworker.models.JOB_FIELDS)
JSON_TYPE = {"Content-Type": "application/json"}


async def enqueue(client: httpx.AsyncClient, type_: str = "email", **fields: Any) -> dict[str, Any]:
    fields.setdefault("payload", {"to": "a@example.com"})
    r = await client.post("/jobs", json={"type": type_, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def claim(
    client: httpx.AsyncClient, worker_id: str = "go-1", **fields: Any
) -> dict[str, Any]:
    r = await client.post("/jobs/claim", json={"worker_id": worker_id, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def assert_problem(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"]
    if field is not None:
        assert body.get("field") == field, body
    assert "Traceback" not in r.text
    return body


async def test_post_jobs_201_200_409_422(server: Served, conn: Any) -> None:
    async with server.client() as c:
        first = await c.post(
            "/jobs",
            json={
                "type": "email",
                "payload": {"to": "a@example.com"},
                "queue": "mail",
                "priority": "high",
                "max_retries": 5,
                "idempotency_key": "order-42",
                "correlation_id": "req-9",
                "run_at": "2030-01-01T09:00:00+00:00",
            },
        )
        assert first.status_code == 201, first.text
        job = first.json()
        assert set(job) == JOB_KEYS
        assert (job["type"], job["queue"], job["priority"], job["max_retries"]) == (
            "email",
            "mail",
            20,
            5,
        )
        assert job["status"] == "pending" and job["payload"] == {"to": "a@example.com"}
        assert job["run_at"].startswith("2030-01-01T09:00:00")
        assert job["correlation_id"] == "req-9"

        again = await c.post(
            "/jobs",
            json={
                "type": "email",
                "payload": {"to": "a@example.com"},
                "idempotency_key": "order-42",
            },
        )
        assert again.status_code == 200, again.text
        assert again.json()["id"] == job["id"]

        other = await c.post(
            "/jobs",
            json={
                "type": "email",
                "payload": {"to": "b@example.com"},
                "idempotency_key": "order-42",
            },
        )
        assert_problem(other, 409)

        delayed = await c.post("/jobs", json={"type": "t", "payload": None, "delay": 60})
        assert delayed.status_code == 201, delayed.text
        assert delayed.json()["run_at"] > job["created_at"]

        for body, field in [
            ({"payload": {}}, "type"),
            ({"type": "", "payload": {}}, "type"),
            ({"type": "t", "payload": {}, "priority": "urgent"}, "priority"),
            ({"type": "t", "payload": {}, "priority": 2**40}, "priority"),
            ({"type": "t", "payload": {}, "max_retries": -1}, "max_retries"),
            ({"type": "t", "payload": {}, "queue": "q" * 64}, "queue"),
            ({"type": "t", "payload": {}, "run_at": "2030-01-01T09:00:00"}, "run_at"),
            ({"type": "t", "payload": {}, "run_at": "tomorrow"}, "run_at"),
            ({"type": "t", "payload": {}, "delay": -1}, "delay"),
            ({"type": "t", "payload": {}, "delay": 1e308}, "delay"),
            ({"type": "t", "payload": {}, "delay": 1, "run_at": "2030-01-01T00:00:00Z"}, "run_at"),
            ({"type": "t", "payload": {}, "typo": 1}, "typo"),
            ({"type": 5, "payload": {}}, "type"),
            ({"type": "t", "payload": {"k": "a\x00b"}}, "payload"),
        ]:
            assert_problem(await c.post("/jobs", json=body), 422, field)
        assert_problem(
            await c.post(
                "/jobs", content=b"{not json", headers={"Content-Type": "application/json"}
            ),
            422,
            "body",
        )
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 2


async def test_claim_heartbeat_complete(server: Served, conn: Any) -> None:
    async with server.client() as c:
        job = await enqueue(c, payload={"n": 1})
        assert (
            await c.post("/jobs/claim", json={"worker_id": "go-1", "types": ["other"]})
        ).status_code == 204
        claimed = await claim(c, lease=5)
        assert claimed["id"] == job["id"] and claimed["attempt"] == 1
        assert set(claimed) == JOB_KEYS | {"attempt"}
        assert claimed["status"] == "running" and claimed["worker_id"] == "go-1"
        assert claimed["max_retries"] == pgworker.RetryPolicy().max_retries
        lease_before = claimed["lease_expires_at"]

        beat = await c.post(
            f"/jobs/{job['id']}/heartbeat", json={"worker_id": "go-1", "attempt": 1, "lease": 60}
        )
        assert beat.status_code == 200, beat.text
        assert beat.json()["lease_expires_at"] > lease_before
        assert beat.json()["cancel_requested"] is False

        done = await c.post(
            f"/jobs/{job['id']}/complete",
            json={"worker_id": "go-1", "attempt": 1, "result": {"sent": True}},
        )
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed" and done.json()["result"] == {"sent": True}
        assert set(done.json()) == JOB_KEYS

        shown = (await c.get(f"/jobs/{job['id']}")).json()
        assert set(shown) == JOB_KEYS | {"attempt_history", "milestones", "steps"}
        assert [a["outcome"] for a in shown["attempt_history"]] == ["completed"]
    rows = await attempts(conn, job["id"])
    assert [(r["attempt"], r["outcome"], r["worker_id"]) for r in rows] == [
        (1, "completed", "go-1")
    ]
    assert await status_of(conn, job["id"]) == "completed"


async def test_claim_fail_retry_then_final(server: Served, conn: Any) -> None:
    async with server.client() as c:
        job = await enqueue(c, max_retries=1)
        first = await claim(c)
        failed = await c.post(
            f"/jobs/{job['id']}/fail",
            json={"worker_id": "go-1", "attempt": 1, "error": "TimeoutError: upstream slow"},
        )
        assert failed.status_code == 200, failed.text
        state = failed.json()
        assert (state["status"], state["retry_count"]) == ("pending", 1)
        assert state["error"] == "TimeoutError: upstream slow"
        assert state["run_at"] > first["claimed_at"]  # RetryPolicy()'s backoff: about 1 s

        second = await wait_for(lambda: _claimed(c), timeout=10)
        assert second["attempt"] == 2
        final = await c.post(
            f"/jobs/{job['id']}/fail",
            json={"worker_id": "go-1", "attempt": 2, "error": "still slow", "retry_after": 0},
        )
        assert final.status_code == 200, final.text
        assert final.json()["status"] == "failed"
        assert "max_retries 1 exhausted" in final.json()["error"]

        other = await enqueue(c)
        await claim(c, worker_id="go-2")
        now = await c.post(
            f"/jobs/{other['id']}/fail",
            json={"worker_id": "go-2", "attempt": 1, "error": "bad input", "permanent": True},
        )
        assert now.json()["status"] == "failed" and now.json()["retry_count"] == 0

        third = await enqueue(c)
        await claim(c, worker_id="go-3")
        soon = await c.post(
            f"/jobs/{third['id']}/fail",
            json={"worker_id": "go-3", "attempt": 1, "error": "e", "retry_after": 3600},
        )
        assert soon.json()["status"] == "pending"
    rows = await attempts(conn, job["id"])
    assert [r["outcome"] for r in rows] == ["retried", "failed"]
    assert rows[0]["error_type"] == "TimeoutError" and rows[0]["error_message"] == "upstream slow"
    run_at = await conn.fetchval(
        "SELECT extract(epoch FROM run_at - now()) FROM pgworker.jobs WHERE id = $1", third["id"]
    )
    assert 3500 < run_at <= 3600


async def _claimed(c: httpx.AsyncClient, worker_id: str = "go-1") -> dict[str, Any] | None:
    r = await c.post("/jobs/claim", json={"worker_id": worker_id})
    return r.json() if r.status_code == 200 else None


async def test_stale_attempt_gets_409(server: Served, conn: Any) -> None:
    async with server.client() as c:
        job = await enqueue(c)
        await claim(c, worker_id="old")
        await c.post(
            f"/jobs/{job['id']}/fail",
            json={"worker_id": "old", "attempt": 1, "error": "x", "retry_after": 0},
        )
        await claim(c, worker_id="new")
        stale = {"worker_id": "old", "attempt": 1}
        for action, extra in [
            ("heartbeat", {}),
            ("complete", {"result": 1}),
            ("fail", {"error": "late"}),
        ]:
            assert_problem(
                await c.post(f"/jobs/{job['id']}/{action}", json={**stale, **extra}), 409
            )
        wrong_worker = {"worker_id": "old", "attempt": 2}
        assert_problem(await c.post(f"/jobs/{job['id']}/complete", json=wrong_worker), 409)
        assert (
            await c.post(f"/jobs/{job['id']}/complete", json={"worker_id": "new", "attempt": 2})
        ).status_code == 200
        # Finished: every attempt is stale now.
        assert_problem(
            await c.post(f"/jobs/{job['id']}/complete", json={"worker_id": "new", "attempt": 2}),
            409,
        )
    rows = await attempts(conn, job["id"])
    assert [r["outcome"] for r in rows] == ["retried", "completed"]


async def test_concurrent_claims_get_distinct_jobs(server: Served, conn: Any) -> None:
    async with server.client() as c:
        ids = {(await enqueue(c, payload={"n": n}))["id"] for n in range(10)}
        answers = await asyncio.gather(
            *(c.post("/jobs/claim", json={"worker_id": f"w{n}"}) for n in range(20))
        )
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 10 + [204] * 10
    claimed = [r.json()["id"] for r in answers if r.status_code == 200]
    assert sorted(claimed) == sorted(ids)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts") == 10


async def test_auth(server: Served) -> None:
    async with httpx.AsyncClient(base_url=server.url) as anonymous:
        assert (await anonymous.get("/healthz")).status_code == 200
        for method, path in [
            ("GET", "/jobs"),
            ("POST", "/jobs"),
            ("GET", "/jobs/1"),
            ("POST", "/jobs/claim"),
            ("GET", "/queues"),
            ("GET", "/workers"),
            ("GET", "/openapi.json"),
        ]:
            r = await anonymous.request(method, path, json={})
            assert_problem(r, 401)
            assert r.headers["www-authenticate"].startswith("Bearer")
            for wrong in ("Bearer nope", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"):
                r = await anonymous.request(method, path, json={}, headers={"Authorization": wrong})
                assert_problem(r, 401)
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert TOKEN not in r.text


async def test_tokens_from_the_environment(dsn: str) -> None:
    env = {"PGWORKER_API_TOKEN": "first-token, second-token"}
    async with (
        serving(dsn, token=None, env=env) as served,
        httpx.AsyncClient(base_url=served.url) as c,
    ):
        for token in ("first-token", "second-token"):
            r = await c.get("/jobs", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
        assert (await c.get("/jobs", headers={"Authorization": "Bearer first"})).status_code == 401


async def test_read_only_refuses_writes(dsn: str, conn: Any) -> None:
    job = await pgworker.enqueue(conn, "email", {})
    async with serving(dsn, "--read-only") as served, served.client() as c:
        for path, body in [
            ("/jobs", {"type": "t", "payload": {}}),
            ("/jobs/claim", {"worker_id": "w"}),
            (f"/jobs/{job.job.id}/cancel", None),
            (f"/jobs/{job.job.id}/replay", None),
            (f"/jobs/{job.job.id}/complete", {"worker_id": "w", "attempt": 1}),
        ]:
            assert_problem(await c.post(path, json=body), 405)
        assert (await c.get("/jobs")).status_code == 200
        assert (await c.get(f"/jobs/{job.job.id}")).status_code == 200
    assert await status_of(conn, job.job.id) == "pending"


async def test_oversized_body_refused(dsn: str, conn: Any) -> None:
    async with serving(dsn, "--body-limit", "1000") as served, served.client() as c:
        big = json.dumps({"type": "t", "payload": {"blob": "x" * 2000}}).encode()
        r = await c.post("/jobs", content=big, headers={"Content-Type": "application/json"})
        assert_problem(r, 413)

        async def chunks():  # no Content-Length: refused while reading
            for _ in range(10):
                yield b" " * 500

        r = await c.post("/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        assert_problem(r, 413)
        assert (await c.post("/jobs", json={"type": "t", "payload": {}})).status_code == 201
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1


async def test_a_body_announced_too_large_is_refused_before_it_is_sent(server: Served) -> None:
    """Only the headers are sent, announcing 1 GB: the 413 comes back at once."""
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    )
    with anyio.fail_after(10):
        async with await anyio.connect_tcp(host, int(port)) as stream:
            await stream.send(head.encode())
            answer = b""
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
                while b"limit" not in answer:  # the server closes the connection after it
                    answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over the limit" in answer


async def test_default_body_limit_is_one_megabyte(server: Served) -> None:
    async with server.client() as c:
        big = json.dumps({"type": "t", "payload": "x" * (1024 * 1024)}).encode()
        r = await c.post("/jobs", content=big, headers={"Content-Type": "application/json"})
        assert_problem(r, 413)
        fits = json.dumps({"type": "t", "payload": "x" * (1000 * 1000)}).encode()
        r = await c.post("/jobs", content=fits, headers={"Content-Type": "application/json"})
        assert r.status_code == 201


FAST_MAINTENANCE = {"PGWORKER_LEASE": "1"}
"""The leader's lease, and so its tick (half of it): a rescue within about a second."""


async def test_serve_rescues_an_http_claim_whose_lease_expired(dsn: str, conn: Any) -> None:
    async with serving(dsn, env=FAST_MAINTENANCE) as served, served.client() as c:
        job = await enqueue(c)
        await claim(c, worker_id="vanished", lease=0.5)
        await wait_for(lambda: _rescued(conn, job["id"]), timeout=30, every=0.1)
        leader = await conn.fetchval("SELECT worker_id FROM pgworker.leader")
        assert leader.startswith("serve-")
    rows = await attempts(conn, job["id"])
    assert [(r["outcome"], r["worker_id"]) for r in rows] == [("lost", "vanished")]
    # RetryPolicy()'s defaults: retried, counted.
    assert await conn.fetchval("SELECT retry_count FROM pgworker.jobs") == 1


async def test_no_maintenance_leaves_rescue_to_others(dsn: str, conn: Any) -> None:
    """Serve with --no-maintenance never leads nor rescues, though it ticks every 0.5 s if it
    did: the lease of a claim is seen expired for 3 s of the database's clock (six of those
    ticks) with the job still running and no leader; then a worker that maintains is started and
    rescues it (so the job was rescuable all along), and the leadership is that worker's."""
    async with serving(dsn, "--no-maintenance", env=FAST_MAINTENANCE) as served:
        async with served.client() as c:
            job = await enqueue(c)
            await claim(c, worker_id="vanished", lease=0.2)
        expired_for = (
            "SELECT status <> 'running' OR now() - lease_expires_at > interval '3 seconds' "
            "FROM pgworker.jobs WHERE id = $1"
        )

        async def settled() -> bool:
            await conn.execute("SELECT pg_sleep(0.1)")  # now() is the statement's start
            return bool(await conn.fetchval(expired_for, job["id"]))

        await wait_for(settled, timeout=60)
        assert await status_of(conn, job["id"]) == "running"
        assert await conn.fetchval("SELECT count(*) FROM pgworker.leader") == 0
        witness = pgworker.Registry()
        witness.task("elsewhere-only", queue="elsewhere")(_nothing)
        async with pgworker.Worker(witness, dsn, worker_id="witness", lease=1.0):
            await wait_for(lambda: _rescued(conn, job["id"]), timeout=30)
            assert await conn.fetchval("SELECT worker_id FROM pgworker.leader") == "witness"
    rows = await attempts(conn, job["id"])
    assert [(r["outcome"], r["worker_id"]) for r in rows] == [("lost", "vanished")]


async def _nothing(ctx: pgworker.JobContext, payload: Any) -> None:
    return None


async def _rescued(conn: Any, job_id: int) -> bool:
    return await status_of(conn, job_id) == "pending"


async def test_serve_without_a_schema_exits_saying_what_to_run(empty_dsn: str) -> None:
    done = run_serve(empty_dsn, "--token", TOKEN)
    assert done.returncode == 2
    assert "pgworker migrate" in done.stderr and "Traceback" not in done.stderr


async def test_serve_without_token_exits_with_a_message(dsn: str) -> None:
    done = run_serve(dsn, "--port", "1")
    assert done.returncode == 2
    assert "PGWORKER_API_TOKEN" in done.stderr and "--insecure-no-auth" in done.stderr
    assert "Traceback" not in done.stderr
    bad = run_serve(dsn, "--token", "with space")
    assert bad.returncode == 2 and "--token" in bad.stderr


async def test_insecure_no_auth(dsn: str) -> None:
    served = serving(dsn, "--insecure-no-auth", token=None)
    async with served as s, httpx.AsyncClient(base_url=s.url) as c:
        assert (await c.get("/jobs")).status_code == 200


async def test_cancel_replay_and_404(server: Served, conn: Any) -> None:
    async with server.client() as c:
        job = await enqueue(c)
        cancelled = await c.post(f"/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert (
            cancelled.json()["status"] == "cancelled" and cancelled.json()["cancel"] == "cancelled"
        )
        replayed = await c.post(f"/jobs/{job['id']}/replay", json={"by": "ops", "reason": "retry"})
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["status"] == "pending"
        assert_problem(await c.post(f"/jobs/{job['id']}/replay"), 409)

        running = await enqueue(c, "stoppable")
        claimed = await claim(c, worker_id="busy", types=["stoppable"])
        assert claimed["id"] == running["id"]
        asked = await c.post(f"/jobs/{running['id']}/cancel")
        assert asked.json()["cancel"] == "cancelling" and asked.json()["status"] == "running"
        beat = await c.post(
            f"/jobs/{running['id']}/heartbeat", json={"worker_id": "busy", "attempt": 1}
        )
        assert beat.json()["cancel_requested"] is True
        ended = await c.post(
            f"/jobs/{running['id']}/fail",
            json={"worker_id": "busy", "attempt": 1, "error": "stopped"},
        )
        assert ended.json()["status"] == "cancelled"

        unknown = 9_000_000_000
        attempt = {"worker_id": "w", "attempt": 1}
        for method, path, body in [
            ("GET", f"/jobs/{unknown}", None),
            ("POST", f"/jobs/{unknown}/heartbeat", attempt),
            ("POST", f"/jobs/{unknown}/complete", attempt),
            ("POST", f"/jobs/{unknown}/fail", {**attempt, "error": "e"}),
            ("POST", f"/jobs/{unknown}/cancel", None),
            ("POST", f"/jobs/{unknown}/replay", None),
        ]:
            assert_problem(await c.request(method, path, json=body), 404)
    assert await status_of(conn, job["id"]) == "pending"


async def test_list_jobs_keyset_pages_and_filters(server: Served) -> None:
    async with server.client() as c:
        made = [await enqueue(c, "a" if n % 2 else "b", correlation_id=f"c{n}") for n in range(5)]
        pages, before = [], None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"before": before} if before else {})}
            page = (await c.get("/jobs", params=params)).json()
            pages.append([j["id"] for j in page["jobs"]])
            before = page["next_before"]
            if before is None:
                break
        assert [i for p in pages for i in p] == sorted((j["id"] for j in made), reverse=True)
        assert all(len(p) <= 2 for p in pages)
        only_a = (await c.get("/jobs", params={"type": "a"})).json()["jobs"]
        assert {j["type"] for j in only_a} == {"a"} and len(only_a) == 2
        by_correlation = (await c.get("/jobs", params={"correlation_id": "c3"})).json()["jobs"]
        assert [j["id"] for j in by_correlation] == [made[3]["id"]]
        assert (await c.get("/jobs", params={"status": "failed"})).json()["jobs"] == []
        assert_problem(await c.get("/jobs", params={"status": "lost"}), 422, "status")
        assert_problem(await c.get("/jobs", params={"limit": 0}), 422, "limit")
        assert_problem(await c.get("/jobs", params={"before": 2**63}), 422, "before")


async def test_queues_and_workers(server: Served) -> None:
    async with server.client() as c:
        await enqueue(c, queue="mail")
        await enqueue(c, queue="mail", delay=3600)
        await enqueue(c)
        claimed = await claim(c, worker_id="go-7", queues=["default"])
        queues = (await c.get("/queues")).json()["queues"]
        by_name = {q["queue"]: q for q in queues}
        assert by_name["mail"]["counts"]["pending"] == 2
        assert by_name["default"]["counts"]["running"] == 1
        assert by_name["mail"]["oldest_pending_s"] >= 0
        assert by_name["default"]["oldest_pending_s"] is None
        workers = (await c.get("/workers")).json()["workers"]
        go7 = next(w for w in workers if w["worker_id"] == "go-7")
        assert go7["running_job_ids"] == [claimed["id"]] and go7["queues"] == ["default"]


@pytest.mark.fresh_db  # it drops the pgworker schema
async def test_healthz_503_when_the_schema_is_not_current(server: Served, conn: Any) -> None:
    async with httpx.AsyncClient(base_url=server.url) as c:
        assert (await c.get("/healthz")).status_code == 200
        await conn.execute(
            "DELETE FROM pgworker.migrations"
            " WHERE version = (SELECT max(version) FROM pgworker.migrations)"
        )
        r = await c.get("/healthz")
        assert_problem(r, 503)
        await conn.execute("DROP SCHEMA pgworker CASCADE")
        assert_problem(await c.get("/healthz"), 503)


HOSTILE_ENQUEUES = [
    ('{"type":"t","payload":{},"priority":1e400}', "priority"),
    ('{"type":"t","payload":{},"priority":true}', "priority"),
    ('{"type":"t","payload":{},"max_retries":99999999999999999999999}', "max_retries"),
    ('{"type":"t","payload":{},"delay":NaN}', "delay"),
    ('{"type":"t","payload":{},"delay":Infinity}', "delay"),
    ('{"type":"t","payload":{},"delay":1e999}', "delay"),
    ('{"type":"t","payload":{},"delay":true}', "delay"),
    ('{"type":"t","payload":{},"delay":"5"}', "delay"),
    ('{"type":"t","payload":NaN}', "payload"),
    ('{"type":"t","payload":[Infinity]}', "payload"),
    ('{"type":"t","payload":1e400}', "payload"),
    ('{"type":"\\ud800","payload":{}}', "type"),
    ('{"type":"t","payload":{"\\ud800":1}}', "payload"),
    ('{"type":"t","payload":"\\udfff"}', "payload"),
    ('{"type":"t\\u0000","payload":{}}', "type"),
    ('{"type":"t","payload":{},"idempotency_key":"\\u0000"}', "idempotency_key"),
    ('{"type":"t","payload":{},"correlation_id":"\\ud800"}', "correlation_id"),
    ('{"type":"t","payload":{},"run_at":"9999-12-31T23:59:59-14:00"}', "run_at"),
    ('{"type":"t","payload":{},"run_at":"0001-01-01T00:00:00+14:00"}', "run_at"),
    ('{"type":"t","payload":{},"run_at":1e308}', "run_at"),
    ('{"type":"t","payload":{},"version":0}', "version"),
    ('{"type":"t","payload":{},"version":99999999999999}', "version"),
    ('{"type":"t","payload":' + "[" * 600 + "]" * 600 + "}", "payload"),
    ("[" * 100_000 + "]" * 100_000, "body"),
    ("[]", "body"),
    ("null", "body"),
    ('"x"', "body"),
]
HOSTILE_CLAIMS = [
    ('{"worker_id":"w","lease":-1}', "lease"),
    ('{"worker_id":"w","lease":1e308}', "lease"),
    ('{"worker_id":"w","lease":0}', "lease"),
    ('{"worker_id":"w","lease":NaN}', "lease"),
    ('{"worker_id":"w\\u0000"}', "worker_id"),
    ('{"worker_id":"\\ud800"}', "worker_id"),
    ('{"worker_id":""}', "worker_id"),
    ('{"worker_id":"w","types":["\\u0000"]}', "types"),
    ('{"worker_id":"w","types":[]}', "types"),
    ('{"worker_id":"w","queues":["\\ud800"]}', "queues"),
    ('{"worker_id":"w","versions":{"t":[0]}}', "versions"),
    ('{"worker_id":"w","versions":{"t":[99999999999999999999]}}', "versions"),
    ('{"worker_id":"w","versions":{"t":[]}}', "versions"),
    ('{"worker_id":"w","versions":{"\\u0000":[1]}}', "versions"),
    ('{"worker_id":"w","versions":[1]}', "versions"),
    ('{"worker_id":"' + "w" * 300 + '"}', "worker_id"),
]


async def test_hostile_input_is_a_4xx_naming_the_field(server: Served, conn: Any) -> None:
    """Bad JSON, huge ints, wrong types, NUL bytes, lone surrogates, negative or endless leases,
    ids out of bigint range: each a 4xx naming the field, never a 500 nor a dead server."""
    json_type = {"Content-Type": "application/json"}
    async with server.client() as c:
        job = await enqueue(c, "hostile")
        for body, field in HOSTILE_ENQUEUES:
            assert_problem(await c.post("/jobs", content=body, headers=json_type), 422, field)
        for body, field in HOSTILE_CLAIMS:
            assert_problem(await c.post("/jobs/claim", content=body, headers=json_type), 422, field)
        assert_problem(
            await c.post("/jobs", content=b"\xff\xfe\x00", headers=json_type), 422, "body"
        )
        assert_problem(await c.post("/jobs", content=b'{"type":"t","payload":{}}'), 422, "body")
        base = f"/jobs/{job['id']}"
        for path, body, field in [
            (f"{base}/heartbeat", '{"worker_id":"w","attempt":99999999999999999999}', "attempt"),
            (f"{base}/heartbeat", '{"worker_id":"w","attempt":-5}', "attempt"),
            (f"{base}/heartbeat", '{"worker_id":"w","attempt":1,"lease":-1}', "lease"),
            (f"{base}/heartbeat", '{"worker_id":"w","attempt":1,"lease":1e308}', "lease"),
            (f"{base}/complete", '{"worker_id":"w","attempt":1,"result":"\\u0000"}', "result"),
            (
                f"{base}/fail",
                '{"worker_id":"w","attempt":1,"error":"e","retry_after":1e308}',
                "retry_after",
            ),
            (
                f"{base}/fail",
                '{"worker_id":"w","attempt":1,"error":"e","retry_after":-1}',
                "retry_after",
            ),
            (
                f"{base}/fail",
                '{"worker_id":"w","attempt":1,"error":"e","permanent":"yes"}',
                "permanent",
            ),
            (f"{base}/fail", '{"worker_id":"w","attempt":1}', "error"),
            (f"{base}/replay", '{"by":"\\u0000"}', "by"),
            (f"{base}/replay", '{"reason":"\\ud800"}', "reason"),
            (f"{base}/replay", "[1]", "body"),
        ]:
            assert_problem(await c.post(path, content=body, headers=json_type), 422, field)
        for path in ["/jobs/99999999999999999999999", "/jobs/-1", "/jobs/0", "/jobs/abc"]:
            assert_problem(await c.get(path), 422, "id")
        assert_problem(await c.post("/jobs/99999999999999999999999/cancel"), 422, "id")
        for query, field in [
            ("type=%00", "type"),
            ("correlation_id=%00x", "correlation_id"),
            ("limit=99999999999999999999999", "limit"),
            ("before=-1", "before"),
            ("status=%00", "status"),
        ]:
            assert_problem(await c.get(f"/jobs?{query}"), 422, field)

        # A worker's error text is hostile too: stored cleaned and redacted, never refused.
        held = await claim(c, "w", types=["hostile"])
        failed = await c.post(
            f"{base}/fail",
            content='{"worker_id":"w","attempt":1,"permanent":true,'
            '"error":"\\ud800 Boom\\u0000 password=hunter22\\nBearer abcdefgh"}',
            headers=json_type,
        )
        assert failed.status_code == 200, failed.text
        assert held["id"] == job["id"] and "hunter22" not in failed.text
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.post("/jobs", json={"type": "t", "payload": {}})).status_code == 201
    detail = await conn.fetchval(
        "SELECT error_detail FROM pgworker.job_attempts WHERE job_id = $1", job["id"]
    )
    assert "abcdefgh" not in detail and "[REDACTED]" in detail


@pytest.mark.fresh_db  # it drops the database
async def test_database_gone_is_503_never_500(server_dsn: str, dsn: str) -> None:
    async with serving(dsn) as served, served.client() as c:
        assert (await c.get("/healthz")).status_code == 200
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE "{database_of(dsn)}" WITH (FORCE)')
        finally:
            await admin.close()
        assert_problem(await c.get("/healthz"), 503)
        assert_problem(await c.get("/jobs"), 503)
        assert_problem(await c.post("/jobs/claim", json={"worker_id": "w"}), 503)
        assert served.process.poll() is None


async def test_token_ok_accepts_each_token_and_nothing_else() -> None:
    from pgworker._web.config import WebConfig, token_ok

    config = WebConfig(dsn="postgresql://x/y", tokens=("old-token", "new-token"))
    assert token_ok(config, "old-token") and token_ok(config, "new-token")
    for wrong in (None, "", "old", "old-token ", "new-tokenx", "\ud800", "é"):
        assert not token_ok(config, wrong)
    assert not token_ok(WebConfig(dsn="postgresql://x/y"), "anything")
    assert token_ok(WebConfig(dsn="postgresql://x/y", insecure_no_auth=True), None)


async def test_serve_without_the_web_extra_names_it(dsn: str, tmp_path: Any) -> None:
    shadow = tmp_path / "fastapi"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('absent', name='fastapi')\n")
    done = run_serve(dsn, "--token", TOKEN, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert done.returncode == 2
    assert f"pip install '{DISTRIBUTION}[web]'" in done.stderr and "fastapi" in done.stderr
    assert "Traceback" not in done.stderr


async def test_serve_stops_on_sigterm_and_exits_0(dsn: str) -> None:
    """An orchestrator's ordinary stop (SIGTERM) is a graceful stop, not a crash: exit 0."""
    async with serving(dsn) as served:
        served.process.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: served.process.wait(timeout=15)) == 0


def _body_schema(document: dict[str, Any], path: str) -> Any:
    """A validator of the JSON body the document says POST `path` takes."""
    import jsonschema_rs

    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    return jsonschema_rs.Draft202012Validator(
        {**schema["schema"], "components": document["components"]}
    )


async def test_nul_in_json_is_refused_by_the_document_and_the_server_alike(
    server: Served, conn: Any
) -> None:
    """jsonb cannot store NUL (U+0000), in a key or in a string: the server refuses it (422
    naming the body's field), and the OpenAPI document says so, so that a client generating
    bodies from it sends none."""
    async with server.client() as c:
        document = (await c.get("/openapi.json")).json()
        event = _body_schema(document, "/events/{name}")
        job = _body_schema(document, "/jobs")
        for data in (
            {"k\u0000": 1},
            {"k": "v\u0000"},
            ["\u0000"],
            "\u0000",
            {"a": [{"\u0000": 0}]},
        ):
            assert not event.is_valid(data), data
            assert not job.is_valid({"type": "t", "payload": data}), data
            sent = json.dumps(data)  # \u0000 escaped, as JSON carries it
            refused = await c.post("/events/e", content=sent, headers=JSON_TYPE)
            assert_problem(refused, 422, "data")
            refused = await c.post(
                "/jobs", content=f'{{"type": "t", "payload": {sent}}}', headers=JSON_TYPE
            )
            assert_problem(refused, 422, "payload")
        for data in ({"k\u00e9": "v\u2028"}, None, [1, "x"]):
            assert event.is_valid(data) and job.is_valid({"type": "t", "payload": data})
            taken = await c.post("/events/e", content=json.dumps(data), headers=JSON_TYPE)
            assert taken.status_code == 200, taken.text
        pending = (await pgworker.enqueue(conn, "t", {"k": 1})).job.id
        changed = await c.patch(
            f"/jobs/{pending}", content='{"payload": {"k\\u0000": 1}}', headers=JSON_TYPE
        )
        assert_problem(changed, 422, "payload")
    assert (await pgworker.get_job(conn, pending)).payload == {"k": 1}
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1
    assert await conn.fetchval("SELECT count(*) FROM pgworker.events") == 3


async def test_a_name_in_the_url_that_is_not_utf8_is_422_naming_it(
    server: Served, conn: Any
) -> None:
    """Percent-decoded, `%FF` is no text: Starlette reads it as U+FFFD, so that `%FF` and
    `%FE` named one queue '\\ufffd'. Now 422 naming the parameter, and nothing acts on any name;
    U+FFFD itself, sent as UTF-8 (%EF%BF%BD), is a name like any other."""
    async with server.client() as c:
        for path in (
            "/queues/%FF/pause",
            "/queues/a%FEb/resume",
            "/queues/%C3/limit",
            "/queues/%ED%A0%80/pause",  # a lone surrogate, in UTF-8's form
        ):
            body = {"max_running": 1} if path.endswith("limit") else {}
            assert_problem(await c.post(path, json=body), 422, "queue")
        assert_problem(await c.post("/events/%FF", json=1), 422, "name")
        assert_problem(await c.get("/jobs?queue=%FF"), 422, "queue")
        assert_problem(await c.get("/jobs?type=ok&error=a%E9"), 422, "error")
        assert_problem(await c.get("/stats?queue=%80"), 422, "queue")
        assert (await c.get("/queues")).json() == {"queues": []}
        taken = await c.post("/queues/%EF%BF%BD/pause", json={})
        assert taken.status_code == 200 and taken.json()["queue"] == "\ufffd", taken.text
        assert (await c.post("/events/%C3%A9", json=1)).json()["name"] == "é"
        assert (await c.get("/jobs?queue=%C3%A9")).status_code == 200
    assert await conn.fetchval("SELECT array_agg(name) FROM pgworker.queues") == ["\ufffd"]
    assert await conn.fetchval("SELECT array_agg(name) FROM pgworker.events") == ["é"]


async def test_post_jobs_payload_is_optional_as_in_python(server: Served, conn: Any) -> None:
    """`enqueue(conn, "t")` stores the payload {}: so does POST /jobs without one, and the
    document says the payload is optional with that default."""
    async with server.client() as c:
        made = await c.post("/jobs", json={"type": "t"})
        assert made.status_code == 201, made.text
        assert made.json()["payload"] == {}
        assert (await c.post("/jobs", json={"type": "t", "payload": None})).json()["payload"] == {}
        document = (await c.get("/openapi.json")).json()
    body = document["components"]["schemas"]["EnqueueBody"]
    assert body["required"] == ["type"] and body["properties"]["payload"]["default"] == {}
    python = await pgworker.enqueue(conn, "t")
    assert python.job.payload == {} == (await pgworker.get_job(conn, made.json()["id"])).payload
