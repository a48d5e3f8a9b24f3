"""A queue's limits from each door: Python (`limit_queue`, `list_queues`), the CLI
(`pgworker queue limit Q [N] [--rate R] [--none]`, `queue list`), the HTTP API (`POST
/queues/{queue}/limit`, `GET /queues`) and the dashboard's form. A change is one row of the
operator log and wakes the queue's workers at commit; a change that changes nothing writes, logs
and sends nothing; bad input is one clear error naming the field, and nothing is written."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import asyncpg
import pytest

import pgworker
from pgworker.operations import UNCHANGED, os_user

from .helpers import cli, wait_for
from .test_dashboard import csrf_of, http
from .test_metrics import free_port, scrape, value
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def snapshot(conn: Any) -> tuple[list[tuple[Any, ...]], int]:
    """Every queues row (its controls and updated_at) and the operator_log's row count: what a
    refused change must leave exactly as it was."""
    rows = await conn.fetch(
        "SELECT name, paused_at, max_running, rate_limit, rate_period, updated_at "
        "FROM pgworker.queues ORDER BY name"
    )
    logged = await conn.fetchval("SELECT count(*) FROM pgworker.operator_log")
    return [tuple(r) for r in rows], logged


async def stored(conn: Any, queue: str = "mail") -> tuple[Any, ...] | None:
    row = await conn.fetchrow(
        "SELECT max_running, rate_limit, rate_period FROM pgworker.queues WHERE name = $1", queue
    )
    return None if row is None else tuple(row)


async def limit_log(conn: Any) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT actor, queue, reason, detail FROM pgworker.operator_log "
        "WHERE action = 'limit' ORDER BY id"
    )
    return [(r["actor"], r["queue"], r["reason"], json.loads(r["detail"])) for r in rows]


def limits(max_running: int | None = None, rate: tuple[int, int] | None = None) -> dict[str, Any]:
    count, period = rate or (None, None)
    return {"max_running": max_running, "rate_limit": count, "rate_period": period}


# --- Python ------------------------------------------------------------------------------------


async def test_limits_are_set_kept_and_cleared_each_change_logged_once(conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    first = await pgworker.limit_queue(conn, "mail", max_running=5, reason="db load", by="alice")
    assert (first.max_running, first.rate, first.changed, first.known) == (5, None, True, True)
    assert await stored(conn) == (5, None, None)
    # A limit left out stays as it is.
    rated = await pgworker.limit_queue(conn, "mail", rate="600/m", by="bob")
    assert (rated.max_running, rated.rate, rated.limits) == (
        5,
        "600/m",
        {"max_running": 5, "rate": "600/m"},
    )
    assert await stored(conn) == (5, 600, 60)
    # The same limits again: nothing changes, nothing is logged.
    again = await pgworker.limit_queue(conn, "mail", max_running=5, rate="10/s", by="carol")
    assert again.changed and again.rate == "10/s"
    same = await pgworker.limit_queue(conn, "mail", max_running=5, rate="10/second", by="dan")
    assert (same.changed, same.max_running, same.rate) == (False, 5, "10/s")
    # None clears one limit; the other stays.
    unrated = await pgworker.limit_queue(conn, "mail", rate=None, by="erin")
    assert (unrated.changed, unrated.max_running, unrated.rate) == (True, 5, None)
    cleared = await pgworker.limit_queue(conn, "mail", max_running=None, rate=None, by="erin")
    assert (cleared.changed, cleared.limits) == (True, {})
    assert await stored(conn) == (None, None, None)
    assert not (await pgworker.limit_queue(conn, "mail", max_running=None)).changed
    assert await limit_log(conn) == [
        ("alice", "mail", "db load", {"old": limits(), "new": limits(5)}),
        ("bob", "mail", None, {"old": limits(5), "new": limits(5, (600, 60))}),
        ("carol", "mail", None, {"old": limits(5, (600, 60)), "new": limits(5, (10, 1))}),
        ("erin", "mail", None, {"old": limits(5, (10, 1)), "new": limits(5)}),
        ("erin", "mail", None, {"old": limits(5), "new": limits()}),
    ]


async def test_unchanged_is_the_default_and_can_be_passed(conn):
    await pgworker.limit_queue(conn, "mail", max_running=3, rate="5/h")
    state = await pgworker.limit_queue(conn, "mail", max_running=UNCHANGED, rate="7/d")
    assert (state.max_running, state.rate) == (3, "7/d")
    assert await stored(conn) == (3, 7, 86400)


async def test_the_actor_is_the_os_user_unless_given(conn):
    await pgworker.limit_queue(conn, "mail", max_running=2)
    assert [r[0] for r in await limit_log(conn)] == [os_user()]


async def test_a_queue_nothing_names_is_limited_and_said_new_clearing_it_writes_nothing(conn):
    cleared = await pgworker.limit_queue(conn, "later", max_running=None, rate=None)
    assert (cleared.changed, cleared.known, cleared.limits) == (False, False, {})
    assert await snapshot(conn) == ([], 0)
    state = await pgworker.limit_queue(conn, "later", rate="1/s")
    assert (state.changed, state.known, state.rate) == (True, False, "1/s")
    assert (await pgworker.limit_queue(conn, "later", rate="2/s")).known


async def test_concurrent_limits_of_a_new_queue_create_it_once(pool):
    states = await asyncio.gather(
        *(pgworker.limit_queue(pool, "fresh", max_running=4, by=f"op-{i}") for i in range(8))
    )
    assert sum(s.changed for s in states) == 1 and {s.max_running for s in states} == {4}
    assert len(await limit_log(pool)) == 1


async def test_list_queues_and_pause_show_the_limits(conn):
    await pgworker.enqueue(conn, "t", {}, queue="a")
    await pgworker.limit_queue(conn, "a", max_running=2, rate="100/h")
    paused = await pgworker.pause_queue(conn, "a", "why")
    assert (paused.paused, paused.max_running, paused.rate) == (True, 2, "100/h")
    resumed = await pgworker.resume_queue(conn, "a")
    assert (resumed.paused, resumed.max_running, resumed.rate) == (False, 2, "100/h")
    await pgworker.pause_queue(conn, "b")
    found = {q.name: q for q in await pgworker.list_queues(conn)}
    assert (found["a"].max_running, found["a"].rate, found["a"].pending) == (2, "100/h", 1)
    assert found["a"].as_json()["limits"] == {"max_running": 2, "rate": "100/h"}
    assert found["b"].limits == {} and found["b"].as_json()["limits"] == {}
    controls = {q.name: q for q in await pgworker.operations.queue_controls(conn)}
    assert controls["a"].limits == {"max_running": 2, "rate": "100/h"}


async def test_a_rate_written_by_hand_in_seconds_is_shown_in_seconds(conn):
    await conn.execute(
        "INSERT INTO pgworker.queues (name, rate_limit, rate_period) VALUES ('odd', 5, 90)"
    )
    assert (await pgworker.list_queues(conn))[0].rate == "5/90s"


async def test_a_limit_in_a_transaction_rolled_back_never_happened(conn):
    tr = conn.transaction()
    await tr.start()
    await pgworker.limit_queue(conn, "mail", max_running=1)
    await tr.rollback()
    assert await snapshot(conn) == ([], 0)


BAD = [
    ({"max_running": 0}, "max_running"),
    ({"max_running": -1}, "max_running"),
    ({"max_running": True}, "max_running"),
    ({"max_running": 1.5}, "max_running"),
    ({"max_running": "5"}, "max_running"),
    ({"max_running": 2**31}, "max_running"),
    ({"rate": "10/fortnight"}, "rate"),
    ({"rate": "0/s"}, "rate"),
    ({"rate": "10001/s"}, "rate"),
    ({"rate": ""}, "rate"),
    ({"rate": 10}, "rate"),
    ({"rate": pgworker.operations.validate.Rate(10, 7)}, "rate"),
    ({"max_running": 3, "rate": "1/y"}, "rate"),
    ({}, "max_running"),
    ({"queue": "", "max_running": 1}, "queue"),
    ({"queue": "q" * 64, "max_running": 1}, "queue"),
    ({"reason": "", "max_running": 1}, "reason"),
    ({"by": "b" * 201, "max_running": 1}, "by"),
    ({"schema": "bad-schema", "max_running": 1}, "schema"),
]


@pytest.mark.parametrize(("bad", "field"), BAD)
async def test_bad_input_names_the_field_and_writes_nothing(conn, bad, field):
    await pgworker.limit_queue(conn, "mail", max_running=2, rate="1/s")
    before = await snapshot(conn)
    arguments: dict[str, Any] = {"queue": "mail", **bad}
    queue = arguments.pop("queue")
    with pytest.raises(pgworker.ValidationError) as raised:
        await pgworker.limit_queue(conn, queue, **arguments)
    assert raised.value.field == field
    assert await snapshot(conn) == before


async def test_a_rate_object_is_taken(conn):
    state = await pgworker.limit_queue(conn, "mail", rate=pgworker.operations.validate.Rate(30, 60))
    assert state.rate == "30/m"


# --- the wake-up -------------------------------------------------------------------------------


async def test_a_change_wakes_the_queues_workers_at_commit_and_no_change_sends_nothing(dsn, conn):
    heard: list[str] = []
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("pgworker_jobs", lambda *args: heard.append(args[3]))

        async def marked(mark: str) -> list[str]:
            """What was heard before `mark`, sent after: the channel in order, no sleep."""
            await conn.execute("SELECT pg_notify('pgworker_jobs', $1)", mark)
            await wait_for(lambda: mark in heard, timeout=10)
            got = heard[: heard.index(mark)]
            heard.clear()
            return got

        await pgworker.limit_queue(conn, "mail", max_running=3)
        assert await marked("m1") == ["mail"]
        await pgworker.limit_queue(conn, "mail", max_running=3)
        assert await marked("m2") == []
        await pgworker.limit_queue(conn, "mail", rate="5/s")
        await pgworker.limit_queue(conn, "mail", max_running=None, rate=None)
        assert await marked("m3") == ["mail", "mail"]
        await pgworker.limit_queue(conn, "mail", max_running=None, rate=None)
        with pytest.raises(pgworker.ValidationError):
            await pgworker.limit_queue(conn, "mail", max_running=0)
        assert await marked("m4") == []
    finally:
        await listener.close()


# --- CLI ---------------------------------------------------------------------------------------


async def test_cli_sets_clears_and_lists_limits(dsn, conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    done = cli("queue", "limit", "mail", "5", "--rate", "600/m", "--reason", "db", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("limited queue mail: max_running 5, rate 600/m"), done.stdout
    assert await stored(conn) == (5, 600, 60)
    same = cli("queue", "limit", "mail", "5", "--dsn", dsn)
    assert same.returncode == 0 and "already had these limits" in same.stdout, same.stdout
    table = cli("queue", "list", "--dsn", dsn).stdout.splitlines()
    assert table[0].split()[:6] == ["queue", "state", "pending", "running", "max_running", "rate"]
    assert table[1].split()[:6] == ["mail", "active", "1", "0", "5", "600/m"]
    listed = json.loads(cli("queue", "list", "--json", "--dsn", dsn).stdout)
    assert listed[0]["limits"] == {"max_running": 5, "rate": "600/m"}

    unrated = cli("queue", "limit", "mail", "--rate", "none", "--by", "alice", "--dsn", dsn)
    assert unrated.returncode == 0 and "max_running 5" in unrated.stdout, unrated.stdout
    assert await stored(conn) == (5, None, None)
    cleared = cli("queue", "limit", "mail", "--none", "--dsn", dsn)
    assert cleared.returncode == 0 and cleared.stdout.startswith("limited queue mail: no limit")
    assert await stored(conn) == (None, None, None)
    again = cli("queue", "limit", "mail", "--none", "--dsn", dsn)
    assert again.returncode == 0 and "had no limit: nothing to clear" in again.stdout
    assert json.loads(cli("queue", "list", "--json", "--dsn", dsn).stdout)[0]["limits"] == {}
    table = cli("queue", "list", "--dsn", dsn).stdout.splitlines()
    assert table[1].split()[:6] == ["mail", "active", "1", "0", "-", "-"]

    fresh = cli("queue", "limit", "nowhere", "2", "--dsn", dsn)
    assert fresh.returncode == 0 and "note: no pending job, worker or earlier control" in (
        fresh.stdout
    )
    assert [(r[0], r[1], r[2]) for r in await limit_log(conn)] == [
        (os_user(), "mail", "db"),
        ("alice", "mail", None),
        (os_user(), "mail", None),
        (os_user(), "nowhere", None),
    ]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["mail", "0"], "N: the most running jobs (max_running) is a whole number from 1"),
        (["mail", "-3"], "N: the most running jobs (max_running) is a whole number from 1"),
        (["mail", "x"], "N: the most running jobs (max_running) is a whole number from 1"),
        (["mail", "2147483648"], "N: the most running jobs (max_running) is a whole number"),
        (["mail", "--rate", "10/fortnight"], "--rate: must be N/unit with a unit of s, m, h"),
        (["mail", "--rate", "0/s"], "--rate: must allow 1 to 10,000 starts per period, got 0"),
        (["mail", "3", "--none"], "--none: clears every limit: give it without N or --rate"),
        (["mail", "--none", "--rate", "1/s"], "--none: clears every limit"),
        (["mail"], "N: give N (the most running jobs), --rate R, or --none"),
        (["", "3"], "QUEUE: must be a non-empty string"),
        (["mail", "3", "--reason", "r" * 2001], "--reason: must be at most 2000"),
        ([], "the following arguments are required: QUEUE"),
    ],
)
async def test_cli_bad_input_is_one_line_exit_2_and_nothing_written(dsn, conn, args, said):
    await pgworker.limit_queue(conn, "mail", max_running=2, rate="1/s")
    before = await snapshot(conn)
    done = cli("queue", "limit", *args, "--dsn", dsn)
    assert done.returncode == 2, done
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await snapshot(conn) == before


# --- HTTP API and dashboard --------------------------------------------------------------------


async def test_http_limit_and_queues(dsn, conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    async with serving(dsn) as served, served.client() as c:
        set_ = await c.post("/queues/mail/limit", json={"max_running": 4, "reason": "db"})
        assert set_.status_code == 200, set_.text
        body = set_.json()
        assert (body["queue"], body["limits"], body["changed"], body["known"]) == (
            "mail",
            {"max_running": 4},
            True,
            True,
        )
        # A key left out is unchanged; null clears.
        rated = (await c.post("/queues/mail/limit", json={"rate": "20/s", "by": "ops"})).json()
        assert rated["limits"] == {"max_running": 4, "rate": "20/s"}
        same = (await c.post("/queues/mail/limit", json={"max_running": 4.0})).json()
        assert same["changed"] is False
        listed = {q["queue"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["mail"]["limits"] == {"max_running": 4, "rate": "20/s"}
        assert listed["mail"]["counts"]["pending"] == 1
        unlimited = await c.post("/queues/mail/limit", json={"max_running": None})
        assert unlimited.json()["limits"] == {"rate": "20/s"}
        slashed = await c.post("/queues/a%2Fb/limit", json={"rate": "1/m"})
        assert slashed.status_code == 200 and slashed.json()["queue"] == "a/b"
        assert slashed.json()["known"] is False
        listed = {q["queue"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["mail"]["limits"] == {"rate": "20/s"}
        assert listed["a/b"]["limits"] == {"rate": "1/m"}

        before = await snapshot(conn)
        for body_, field in [
            ({"max_running": 0}, "max_running"),
            ({"max_running": -1}, "max_running"),
            ({"max_running": "5"}, "max_running"),
            ({"max_running": True}, "max_running"),
            ({"max_running": 1.5}, "max_running"),
            ({"rate": "10/fortnight"}, "rate"),
            ({"rate": "0/s"}, "rate"),
            ({"rate": 10}, "rate"),
            ({"max_running": 2, "rate": "0/s"}, "rate"),
            ({}, "body"),
            ({"reason": "why"}, "body"),
            ({"max": 3}, "max"),
        ]:
            refused = await c.post("/queues/mail/limit", json=body_)
            assert refused.status_code == 422, (body_, refused.text)
            assert refused.json()["field"] == field, (body_, refused.json())
        assert await snapshot(conn) == before
        anonymous = await c.post(
            "/queues/mail/limit", json={"max_running": 1}, headers={"Authorization": ""}
        )
        assert anonymous.status_code == 401
        assert await snapshot(conn) == before
    assert [(r[0], r[1], r[2]) for r in await limit_log(conn)] == [
        ("api", "mail", "db"),
        ("ops", "mail", None),
        ("api", "mail", None),
        ("api", "a/b", None),
    ]


async def test_a_read_only_server_refuses_limits(dsn, conn):
    async with serving(dsn, "--read-only") as served, served.client() as c:
        answer = await c.post("/queues/mail/limit", json={"max_running": 1})
        assert answer.status_code == 405, answer.text
        async with http(served) as client:
            page = await client.get("/")
            assert "/ui/queues/limit" not in page.text
            answer = await client.post(
                "/ui/queues/limit",
                data={"csrf": csrf_of(page.text), "queue": "mail", "max_running": "1"},
            )
            assert answer.status_code == 405
    assert await snapshot(conn) == ([], 0)


async def test_the_dashboard_form_shows_sets_and_clears_limits(dsn, conn):
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    # The form is on the queue's page (one queue), not on every row of the queues page.
    queue_page = "/ui/queues/mail"
    async with serving(dsn) as served, http(served) as client:

        async def send(**fields: str) -> Any:
            token = csrf_of((await client.get(queue_page)).text)
            return await client.post(
                "/ui/queues/limit",
                data={"csrf": token, "queue": "mail", "back": "queue", **fields},
            )

        async def submit(**fields: str) -> str:
            answer = await send(**fields)
            assert answer.status_code == 303, answer.text
            assert answer.headers["location"] == queue_page
            return (await client.get(queue_page)).text

        assert "/ui/queues/limit" not in (await client.get("/")).text
        page = (await client.get(queue_page)).text
        form = re.search(r'<form[^>]*action="/ui/queues/limit">(.*?)</form>', page, re.S)
        assert form is not None and "no limit" in page
        assert f'name="csrf" value="{csrf_of(page)}"' in form.group(1)
        assert 'name="queue" value="mail"' in form.group(1)
        shown = await submit(max_running="3", rate="600/m")
        assert "Queue mail now has at most 3 running, at most 600/m starts." in shown
        assert 'name="max_running" min="1" size="5" value="3"' in shown
        assert 'name="rate" size="7" value="600/m"' in shown
        assert await stored(conn) == (3, 600, 60)
        assert "Queue mail already had these limits." in await submit(max_running="3", rate="600/m")
        shown = await submit(max_running="", rate="")
        assert "Queue mail now has no limit." in shown
        assert await stored(conn) == (None, None, None)

        before = await snapshot(conn)
        for fields, said in [
            ({"max_running": "0", "rate": ""}, "max_running: must be an int from 1"),
            ({"max_running": "x", "rate": ""}, "max_running: must be a whole number"),
            ({"max_running": "", "rate": "10/fortnight"}, "rate: must be N/unit"),
            ({"max_running": "", "rate": "0/s"}, "rate: must allow 1 to 10,000"),
        ]:
            bad = await send(**fields)
            assert bad.status_code == 400 and said in bad.text, (fields, bad.text)
        refused = await client.post(
            "/ui/queues/limit", data={"csrf": "x", "queue": "mail", "max_running": "1"}
        )
        assert refused.status_code == 403
        assert await snapshot(conn) == before
    assert [(r[0], r[1]) for r in await limit_log(conn)] == [
        ("dashboard", "mail"),
        ("dashboard", "mail"),
    ]


# --- metrics -------------------------------------------------------------------------------------


async def test_the_elected_worker_says_each_queues_max_running(dsn, conn):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        pass

    for queue in ("a", "b"):
        await pgworker.enqueue(conn, "t", {}, queue=queue, delay=3600)
    await pgworker.limit_queue(conn, "a", max_running=7)
    port = free_port()
    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=1):

        def most() -> tuple[float | None, float | None]:
            samples = scrape(port)
            return tuple(value(samples, "pgworker_queue_max_running", queue=q) for q in ("a", "b"))

        await wait_for(lambda: most() == (7.0, None), timeout=15)
        await pgworker.limit_queue(conn, "a", max_running=None)
        await wait_for(lambda: most() == (None, None), timeout=15)
