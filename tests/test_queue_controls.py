"""Pausing a queue from each door: Python (`pause_queue`, `resume_queue`,
`list_queues`), the CLI (`pgworker queue pause|resume|list`), the HTTP API (`POST
/queues/{queue}/pause|resume`, `GET /queues`) and the dashboard's button. A pause or resume that
changes nothing logs nothing; a queue nothing names yet is paused all the same, and said so; bad
input is one clear error naming the field, and nothing is written."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker.operations import os_user

from .helpers import cli, wait_for
from .test_bounds import BOUND, serve_idle
from .test_dashboard import csrf_of, http
from .test_metrics import free_port, scrape, value
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def written(conn: Any) -> tuple[int, int]:
    """Rows of queues and of operator_log."""
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM pgworker.queues) AS queues, "
        "(SELECT count(*) FROM pgworker.operator_log) AS log"
    )
    return row["queues"], row["log"]


async def log_of(conn: Any) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT actor, action, queue, reason FROM pgworker.operator_log ORDER BY id"
    )
    return [tuple(r) for r in rows]


# --- Python ------------------------------------------------------------------------------------


async def test_a_second_pause_or_resume_changes_nothing_and_logs_nothing(conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    first = await pgworker.pause_queue(conn, "mail", "provider down", by="alice")
    again = await pgworker.pause_queue(conn, "mail", "other reason", by="bob")
    assert (first.changed, again.changed) == (True, False)
    assert (again.paused_by, again.reason, again.paused_at) == (
        "alice",
        "provider down",
        first.paused_at,
    )
    resumed = await pgworker.resume_queue(conn, "mail", by="alice")
    twice = await pgworker.resume_queue(conn, "mail", by="bob")
    assert (resumed.changed, resumed.paused, twice.changed, twice.paused) == (
        True,
        False,
        False,
        False,
    )
    assert await log_of(conn) == [
        ("alice", "pause", "mail", "provider down"),
        ("alice", "resume", "mail", None),
    ]


async def test_concurrent_pauses_of_a_new_queue_pause_it_once(pool):
    states = await asyncio.gather(
        *(pgworker.pause_queue(pool, "fresh", by=f"op-{i}") for i in range(8))
    )
    assert sum(s.changed for s in states) == 1
    assert {s.paused_by for s in states} == {next(s.paused_by for s in states if s.changed)}
    assert await written(pool) == (1, 1)


async def test_the_actor_is_the_os_user_unless_given(conn):
    state = await pgworker.pause_queue(conn, "mail")
    assert state.paused_by == os_user()
    assert await log_of(conn) == [(os_user(), "pause", "mail", None)]


async def test_a_queue_nothing_names_is_paused_before_its_first_job_and_said_new(conn):
    state = await pgworker.pause_queue(conn, "later")
    assert state.paused and state.changed and not state.known
    job = await pgworker.enqueue(conn, "t", {}, queue="later")
    assert job.job.status.value == "pending"
    found = {q.name: q for q in await pgworker.list_queues(conn)}
    assert found["later"].paused and (found["later"].pending, found["later"].running) == (1, 0)
    assert (await pgworker.resume_queue(conn, "later")).known
    # A worker registered for a queue names it.
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency) "
        "VALUES ('w', 'h', 1, '{served}', '{t}', 1)"
    )
    assert (await pgworker.pause_queue(conn, "served")).known


async def test_list_queues_counts_jobs_and_shows_pauses(conn):
    await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("t", {"n": n}, queue="a") for n in range(3)]
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'running' WHERE id = (SELECT min(id) FROM pgworker.jobs)"
    )
    await pgworker.enqueue(conn, "t", {}, queue="b")
    await pgworker.pause_queue(conn, "b", "why", by="me")
    await pgworker.pause_queue(conn, "c")
    found = await pgworker.list_queues(conn)
    assert [(q.name, q.paused, q.pending, q.running) for q in found] == [
        ("a", False, 2, 1),
        ("b", True, 1, 0),
        ("c", True, 0, 0),
    ]
    assert found[1].as_json()["pause_reason"] == "why" and found[1].limits == {}


async def test_a_pause_in_a_transaction_rolled_back_never_happened(conn):
    tr = conn.transaction()
    await tr.start()
    await pgworker.pause_queue(conn, "mail")
    await tr.rollback()
    assert await written(conn) == (0, 0)


BAD = [
    ({"queue": ""}, "queue"),
    ({"queue": "q" * 64}, "queue"),
    ({"queue": "a\x00b"}, "queue"),
    ({"queue": 42}, "queue"),
    ({"queue": None}, "queue"),
    ({"reason": "r" * 2001}, "reason"),
    ({"reason": ""}, "reason"),
    ({"reason": "a\x00"}, "reason"),
    ({"by": "b" * 201}, "by"),
    ({"by": ""}, "by"),
    ({"schema": "bad-schema"}, "schema"),
]


@pytest.mark.parametrize(("bad", "field"), BAD)
@pytest.mark.parametrize("act", ["pause_queue", "resume_queue"])
async def test_bad_input_names_the_field_and_writes_nothing(conn, act, bad, field):
    arguments: dict[str, Any] = {"queue": "mail", **bad}
    queue = arguments.pop("queue")
    with pytest.raises(pgworker.ValidationError) as raised:
        await getattr(pgworker, act)(conn, queue, **arguments)
    assert raised.value.field == field
    assert await written(conn) == (0, 0)


# --- CLI ---------------------------------------------------------------------------------------


async def test_cli_pause_resume_and_list(dsn, conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    done = cli("queue", "pause", "mail", "--reason", "provider down", "--by", "alice", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("paused queue mail (since ") and "by alice: provider down" in (
        done.stdout
    )
    again = cli("queue", "pause", "mail", "--dsn", dsn)
    assert again.returncode == 0 and again.stdout.startswith("queue mail was already paused")
    fresh = cli("queue", "pause", "nowhere", "--dsn", dsn)
    assert fresh.returncode == 0 and "note: no pending job, worker or earlier control" in (
        fresh.stdout
    )
    table = cli("queue", "list", "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "queue",
        "state",
        "pending",
        "running",
        "max_running",
        "rate",
        "since",
        "by",
        "reason",
    ]
    assert lines[1].split()[:4] == ["mail", "paused", "1", "0"]
    assert lines[1].endswith("alice  provider down")
    listed = json.loads(cli("queue", "list", "--json", "--dsn", dsn).stdout)
    assert [(q["queue"], q["paused"], q["pending"], q["limits"]) for q in listed] == [
        ("mail", True, 1, {}),
        ("nowhere", True, 0, {}),
    ]
    resumed = cli("queue", "resume", "mail", "--reason", "back", "--dsn", dsn)
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed queue mail")
    assert await log_of(conn) == [
        ("alice", "pause", "mail", "provider down"),
        (os_user(), "pause", "nowhere", None),
        (os_user(), "resume", "mail", "back"),
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["queue", "pause", ""], "QUEUE: must be a non-empty string"),
        (["queue", "pause", "q" * 64], "QUEUE: must be at most 63 characters"),
        (["queue", "pause", "q", "--reason", "r" * 2001], "--reason: must be at most 2000"),
        (["queue", "resume", "q", "--by", "b" * 201], "--by: must be at most 200"),
        (["queue", "pause"], "the following arguments are required: QUEUE"),
    ],
)
async def test_cli_bad_input_is_one_line_exit_2_and_nothing_written(dsn, conn, args, said):
    done = cli(*args, "--dsn", dsn)
    assert done.returncode == 2, done
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await written(conn) == (0, 0)


async def test_cli_escapes_a_queue_name_before_the_terminal(dsn, conn):
    await pgworker.pause_queue(conn, "evil\x1b[2J\rname", reason="why\x1b]0;x\x07")
    for args in (["queue", "list"], ["queue", "pause", "evil\x1b[2J\rname"]):
        done = cli(*args, "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        assert "\x1b" not in done.stdout and "\r" not in done.stdout, done.stdout


# --- HTTP API and dashboard --------------------------------------------------------------------


async def test_http_pause_resume_and_queues(dsn, conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    async with serving(dsn) as served, served.client() as c:
        paused = await c.post("/queues/mail/pause", json={"reason": "provider down"})
        assert paused.status_code == 200, paused.text
        body = paused.json()
        assert (body["queue"], body["paused"], body["paused_by"], body["pause_reason"]) == (
            "mail",
            True,
            "api",
            "provider down",
        )
        assert (body["changed"], body["known"], body["limits"]) == (True, True, {})
        again = (await c.post("/queues/mail/pause")).json()
        assert (again["changed"], again["pause_reason"]) == (False, "provider down")
        # Any queue name reaches its route, a `/` too.
        slashed = await c.post("/queues/a%2Fb/pause", json={"by": "ops"})
        assert slashed.status_code == 200 and slashed.json()["queue"] == "a/b"
        assert slashed.json()["known"] is False

        listed = {q["queue"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["mail"]["paused"] and listed["mail"]["counts"]["pending"] == 1
        assert listed["a/b"]["paused"] and listed["a/b"]["counts"]["pending"] == 0
        assert listed["mail"]["paused_by"] == "api" and listed["mail"]["limits"] == {}

        resumed = await c.post("/queues/mail/resume", json={"by": "ops", "reason": "back"})
        assert resumed.status_code == 200 and resumed.json()["changed"] is True
        assert resumed.json()["paused"] is False
        listed = {q["queue"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["mail"]["paused"] is False and listed["mail"]["paused_at"] is None

        before = await written(conn)
        for path, body, field in [
            ("/queues/mail/pause", {"reason": ""}, "reason"),
            ("/queues/mail/pause", {"reason": "r" * 2001}, "reason"),
            ("/queues/mail/pause", {"by": "b" * 201}, "by"),
            ("/queues/mail/pause", {"because": "x"}, "because"),
            ("/queues/" + "q" * 64 + "/pause", None, "queue"),
            ("/queues/mail/resume", {"reason": 3}, "reason"),
        ]:
            refused = await c.post(path, json=body)
            assert refused.status_code == 422, (path, body, refused.text)
            assert refused.json()["field"] == field, (path, body, refused.json())
        assert await written(conn) == before
    assert await log_of(conn) == [
        ("api", "pause", "mail", "provider down"),
        ("ops", "pause", "a/b", None),
        ("ops", "resume", "mail", "back"),
    ]


async def test_a_pause_waiting_on_a_locked_queue_is_503_in_time_and_never_applied(dsn, conn):
    """Another session holds the queue's row (an operator's transaction): the request gives up
    within the API's bound, and the pause is never applied later, nor logged."""
    await pgworker.pause_queue(conn, "mail")
    await pgworker.resume_queue(conn, "mail")
    async with serving(dsn) as served, served.client(timeout=30) as c:
        locker = await asyncpg.connect(dsn)
        try:
            tx = locker.transaction()
            await tx.start()
            await locker.execute("SELECT 1 FROM pgworker.queues WHERE name = 'mail' FOR UPDATE")
            started = time.monotonic()
            answer = await c.post("/queues/mail/pause")
            took = time.monotonic() - started
            await tx.rollback()
        finally:
            await locker.close()
        assert answer.status_code == 503 and took < BOUND, (answer.text, took)
        assert int(answer.headers["Retry-After"]) >= 1
        await wait_for(lambda: serve_idle(conn), timeout=30)
        assert not (await pgworker.list_queues(conn))[0].paused
        assert [r[1] for r in await log_of(conn)] == ["pause", "resume"]
        assert (await c.post("/queues/mail/pause")).json()["changed"] is True


async def test_a_read_only_server_refuses_pause_and_resume(dsn, conn):
    async with serving(dsn, "--read-only") as served, served.client() as c:
        for verb in ("pause", "resume"):
            answer = await c.post(f"/queues/mail/{verb}")
            assert answer.status_code == 405, answer.text
        assert (await c.get("/queues")).status_code == 200
        async with http(served) as client:
            page = await client.get("/")
            assert "/ui/queues/pause" not in page.text
            answer = await client.post(
                "/ui/queues/pause", data={"csrf": csrf_of(page.text), "queue": "mail"}
            )
            assert answer.status_code == 405
    assert await written(conn) == (0, 0)


async def test_the_dashboard_button_pauses_and_resumes_as_the_dashboard(dsn, conn):
    waiting = (await pgworker.enqueue(conn, "t", {}, queue="mail")).job.id
    async with serving(dsn) as served, http(served) as client:

        async def press(action: str, queue: str) -> str:
            token = csrf_of((await client.get("/")).text)
            answer = await client.post(f"/ui/queues/{action}", data={"csrf": token, "queue": queue})
            assert answer.status_code == 303 and answer.headers["location"] == "/"
            return (await client.get("/")).text

        page = (await client.get("/")).text
        assert 'action="/ui/queues/pause"' in page and 'value="mail"' in page
        shown = await press("pause", "mail")
        assert "Queue mail is paused" in shown and "Paused" in shown
        job = (await client.get(f"/ui/jobs/{waiting}")).text
        assert "Waiting: its queue is paused (by dashboard" in job
        assert 'action="/ui/queues/resume"' in shown
        assert "Queue mail was already paused" in await press("pause", "mail")
        assert "Queue mail is resumed" in await press("resume", "mail")
        assert "its queue is paused" not in (await client.get(f"/ui/jobs/{waiting}")).text
        assert "Queue mail was not paused" in await press("resume", "mail")
        # Without this session's CSRF token, nothing happens.
        refused = await client.post("/ui/queues/pause", data={"csrf": "x", "queue": "mail"})
        assert refused.status_code == 403
        token = csrf_of((await client.get("/")).text)
        bad = await client.post("/ui/queues/pause", data={"csrf": token, "queue": "q" * 64})
        assert bad.status_code == 400 and "queue: must be at most 63" in bad.text
    assert await log_of(conn) == [
        ("dashboard", "pause", "mail", None),
        ("dashboard", "resume", "mail", None),
    ]


# --- metrics -------------------------------------------------------------------------------------


async def test_the_elected_worker_says_which_queues_are_paused(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        pass

    for queue in ("a", "b"):
        await pgworker.enqueue(conn, "t", {}, queue=queue, delay=3600)
    await pgworker.pause_queue(conn, "a")
    port = free_port()
    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=1):

        def paused() -> tuple[float | None, float | None]:
            samples = scrape(port)
            return tuple(value(samples, "pgworker_queue_paused", queue=q) for q in ("a", "b"))

        await wait_for(lambda: paused() == (1.0, 0.0), timeout=15)
        await pgworker.resume_queue(conn, "a")
        await wait_for(lambda: paused() == (0.0, 0.0), timeout=15)


async def test_http_queue_names_with_a_line_break_reach_their_routes(dsn, conn):
    """Starlette's `path` parameters stop at a line break: such a queue was a 404."""
    async with serving(dsn) as served, served.client() as c:
        for verb in ("pause", "limit", "resume"):
            body = {"rate": "1/m"} if verb == "limit" else {}
            answer = await c.post(f"/queues/a%0Ab/{verb}", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["queue"] == "a\nb"


# --- huge names and reasons in the lists -----------------------------------------------------


async def test_a_huge_author_or_task_does_not_pad_every_line_of_the_lists(dsn: str, conn: Any):
    """`queue list` and `periodic list` align their columns: one value of 200,000 characters
    must not make every line of the table that long."""
    await conn.execute(
        "INSERT INTO pgworker.queues (name, paused_at, paused_by, pause_reason)"
        " SELECT 'q' || g, now(), CASE WHEN g = 1 THEN repeat('B', 200000) ELSE 'ops' END,"
        " repeat('R', 1000000) FROM generate_series(1, 30) AS g"
    )
    await conn.execute(
        "INSERT INTO pgworker.periodic (name, type, schedule, next_slot)"
        " SELECT 's' || g, CASE WHEN g = 1 THEN repeat('T', 200000) ELSE 'tick' END,"
        " CASE WHEN g = 2 THEN repeat('S', 200000) ELSE 'every 1s' END, now()"
        " FROM generate_series(1, 30) AS g"
    )
    for args in (["queue", "list"], ["periodic", "list"]):
        done = cli(*args, "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 31 and max(map(len, lines)) < 1000, (args, max(map(len, lines)))


async def test_a_huge_pause_reason_or_author_does_not_swell_the_dashboard(dsn: str, conn: Any):
    """A reason of 1,000,000 characters and an author of 200,000 (rows set by hand: pause_queue
    takes at most 2,000 and 200) are shown cut on the queues page and a waiting job's page."""
    await conn.execute(
        "INSERT INTO pgworker.queues (name, paused_at, paused_by, pause_reason)"
        " VALUES ('big', now(), repeat('B', 200000), repeat('R', 1000000))"
    )
    waiting = (await pgworker.enqueue(conn, "t", {}, queue="big")).job.id
    async with serving(dsn) as served, http(served) as client:
        for page in ("/", f"/ui/jobs/{waiting}"):
            answer = await client.get(page)
            assert answer.status_code == 200, page
            assert "RRRR" in answer.text and "BBBB" in answer.text
            assert len(answer.text) < 100_000, (page, len(answer.text))
