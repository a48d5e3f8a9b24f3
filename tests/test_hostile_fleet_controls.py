"""Hostile input against periodic schedules and queue pausing (issue 23): options that must be a
ConfigError at registration, and rows of `queues` and `periodic` written by someone else (an
operator's UPDATE, a bad restore) that every reader must survive: the CLI, the HTTP API, the
dashboard and the worker that enqueues the schedules."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

import pgworker
from pgworker.operations import list_periodic, list_queues, queue_controls

from .helpers import has_status, wait_for
from .test_dashboard import http
from .test_queue_controls import cli
from .webserver import serving

aio = pytest.mark.asyncio(loop_scope="session")

# What a psql session can store in a timestamptz but Python's datetime cannot hold: asyncpg gives
# naive datetimes for the infinities, and raises OverflowError for a year BC or after 9999.
HOSTILE_TIMES = ("-infinity", "infinity", "0044-03-15 BC", "10000-01-01 00:00:00+00")


# --- registration ------------------------------------------------------------------------------


@pytest.mark.parametrize("zone", ["Europe", "America/", "a" * 10_000, "Europe/" + "b" * 300])
def test_a_time_zone_naming_a_directory_or_too_long_is_a_config_error(zone: str):
    """ZoneInfo reads the zone's file: a directory of the tz database (`Europe`) is an
    IsADirectoryError, a name longer than a file name an OSError; both are unknown zones."""
    registry = pgworker.Registry()

    @registry.task("tick")
    async def tick(ctx: pgworker.JobContext, payload: dict) -> None: ...

    with pytest.raises(pgworker.ConfigError) as raised:
        registry.periodic(tick, "* * * * *", timezone=zone)
    assert raised.value.field == "timezone"
    assert registry.schedules() == []


# --- hostile rows: the readers -----------------------------------------------------------------


async def hostile_rows(conn: Any) -> None:
    """A paused queue and a schedule for each time Python cannot hold."""
    for n, moment in enumerate(HOSTILE_TIMES):
        await conn.execute(
            "INSERT INTO pgworker.queues (name, paused_at, paused_by, pause_reason)"
            " VALUES ($1, $2::text::timestamptz, 'ops', 'restore')",
            f"q{n}",
            moment,
        )
        await conn.execute(
            "INSERT INTO pgworker.periodic (name, type, schedule, next_slot, last_slot, checked_at)"
            " VALUES ($1, 't', 'every 1s', $2::text::timestamptz, $2::text::timestamptz,"
            " $2::text::timestamptz)",
            f"s{n}",
            moment,
        )


def aware(moment: datetime | None) -> bool:
    return moment is not None and moment.tzinfo is not None


@aio
async def test_infinite_and_out_of_range_times_are_listed_not_a_crash(dsn: str, conn: Any):
    await hostile_rows(conn)
    queues = await list_queues(conn)
    assert [q.name for q in queues] == ["q0", "q1", "q2", "q3"]
    assert all(q.paused and aware(q.paused_at) for q in queues)
    assert all(c.paused and aware(c.paused_at) for c in await queue_controls(conn))
    schedules = await list_periodic(conn)
    assert all(aware(s.next_slot) and aware(s.last_slot) for s in schedules)
    # A pause of a queue paused that way answers with the pause as it stands, writing nothing.
    again = await pgworker.pause_queue(conn, "q0", by="alice")
    assert (again.changed, again.paused, aware(again.paused_at)) == (False, True, True)
    resumed = await pgworker.resume_queue(conn, "q2", by="alice")
    assert resumed.changed and not resumed.paused
    for args in (["queue", "list"], ["periodic", "list"]):
        for extra in ([], ["--json"]):
            done = cli(*args, *extra, dsn=dsn)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr
            if extra:
                json.loads(done.stdout)
    pause = cli("queue", "pause", "q1", dsn=dsn)
    assert pause.returncode == 0 and "was already paused" in pause.stdout, pause.stderr


@aio
async def test_infinite_and_out_of_range_times_in_the_http_api_and_the_dashboard(
    dsn: str, conn: Any
):
    await hostile_rows(conn)
    waiting = (await pgworker.enqueue(conn, "t", {}, queue="q0")).job.id
    async with serving(dsn) as served:
        async with served.client() as c:
            listed = await c.get("/queues")
            assert listed.status_code == 200, listed.text
            paused = {q["queue"]: q["paused_at"] for q in listed.json()["queues"]}
            assert all(paused[f"q{n}"].endswith("+00:00") for n in range(4)), paused
            schedules = await c.get("/periodic")
            assert schedules.status_code == 200, schedules.text
            assert all(s["next_slot"].endswith("+00:00") for s in schedules.json()["schedules"])
            again = await c.post("/queues/q3/pause")
            assert again.status_code == 200 and again.json()["changed"] is False, again.text
        async with http(served) as client:
            for page in ("/", "/ui/periodic", f"/ui/jobs/{waiting}"):
                answer = await client.get(page)
                assert answer.status_code == 200, (page, answer.status_code, served.stderr())


# --- hostile rows: the worker ------------------------------------------------------------------


@aio
async def test_a_hostile_periodic_row_stops_no_schedule(dsn: str, conn: Any):
    """Rows of the worker's own schedules with a next slot it cannot hold, or one thousands of
    years away (no schedule of the code can be that far: the row is wrong): each schedule starts
    again from now, the others are not held back, and the worker serves its other jobs."""
    registry = pgworker.Registry()

    @registry.task("tick")
    async def tick(ctx: pgworker.JobContext, payload: dict) -> None: ...

    @registry.task("other")
    async def other(ctx: pgworker.JobContext, payload: dict) -> None: ...

    names = [*(f"s{n}" for n in range(len(HOSTILE_TIMES))), "far", "fine"]
    for name in names:
        registry.periodic(tick, every=1, name=name)
    await hostile_rows(conn)
    await conn.execute(
        "INSERT INTO pgworker.periodic (name, type, schedule, next_slot)"
        " VALUES ('far', 'tick', 'every 1s', '9999-12-31 00:00:00+00')"
    )
    job = (await registry.enqueue(conn, "other")).job.id

    async def every_schedule_ran() -> bool:
        found = await conn.fetch(
            "SELECT split_part(idempotency_key, ':', 2) AS name, count(*) AS n FROM pgworker.jobs"
            " WHERE idempotency_key LIKE 'periodic:%' GROUP BY 1"
        )
        return {r["name"] for r in found if r["n"] >= 2} == set(names)

    async with pgworker.Worker(registry, dsn, lease=4.0, poll_interval=0.2):
        await wait_for(every_schedule_ran, timeout=30)
        await wait_for(lambda: has_status(conn, job, "completed"))
    rows = await conn.fetch(
        "SELECT next_slot, last_slot FROM pgworker.periodic WHERE name = ANY($1)", names
    )
    now = datetime.now(UTC)
    assert all(
        aware(r[c]) and r[c].year == now.year for r in rows for c in ("next_slot", "last_slot")
    )


# --- hostile rows: huge text in the CLI's tables -----------------------------------------------


@aio
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
        done = cli(*args, dsn=dsn)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 31 and max(map(len, lines)) < 1000, (args, max(map(len, lines)))


@aio
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
