"""Periodic jobs: the options checked at registration, the slots of a schedule
on a clock the test sets (time zones and DST), the catch-up policies, and the service on a real
database: the slot reaches the handler, a schedule removed from the code stops, two fleets with
other schedule sets each enqueue their own. tests/test_periodic_fleet.py runs real processes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from structlog.testing import capture_logs

import pgworker
import pgworker.testing
from pgworker._maintenance.periodic import Periodic, grace
from pgworker._schedule import MAX_CATCH_UP, key, set_name
from pgworker.operations import list_periodic, list_queues, queue_controls
from pgworker.settings import Settings

from .helpers import cli, has_status, wait_for
from .test_dashboard import http
from .webserver import serving

PARIS = ZoneInfo("Europe/Paris")
aio = pytest.mark.asyncio(loop_scope="session")


def registry_with(*names: str) -> tuple[pgworker.Registry, Any]:
    registry = pgworker.Registry()
    handle = None
    for name in names:

        async def handler(ctx: pgworker.JobContext, payload: dict) -> dict:
            return {"scheduled_at": ctx.scheduled_at.isoformat() if ctx.scheduled_at else None}

        handle = registry.task(name, queue="ticks", priority="high")(handler)
    return registry, handle


# --- registration -----------------------------------------------------------------------------

BAD = [
    ({"cron": "61 * * * *"}, "cron"),
    ({"cron": "every minute"}, "cron"),
    ({"cron": "* * * *"}, "cron"),
    ({"cron": "* * * * *", "timezone": "Europe/Atlantis"}, "timezone"),
    ({"every": 0}, "every"),
    ({"every": -5}, "every"),
    ({"every": timedelta(0)}, "every"),
    ({"every": 0.5}, "every"),
    ({"every": "1"}, "every"),
    ({"every": 1, "catch_up": "some"}, "catch_up"),
    ({"every": 86400, "timezone": "Europe/Paris"}, "timezone"),
    ({}, "cron"),
    ({"cron": "* * * * *", "every": 1}, "cron"),
    ({"every": 1, "payload": {"when": datetime.now(UTC)}}, "payload"),
    ({"every": 1, "payload": float("nan")}, "payload"),
    ({"every": 1, "queue": ""}, "queue"),
    ({"every": 1, "priority": "urgent"}, "priority"),
    ({"every": 1, "name": ""}, "name"),
]


@pytest.mark.parametrize(
    ("options", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)]
)
def test_bad_options_are_a_config_error_naming_the_field(options: dict[str, Any], field: str):
    registry, _ = registry_with("tick")
    with pytest.raises(pgworker.ConfigError) as caught:
        registry.periodic("tick", **options)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert registry.schedules() == []  # nothing registered


def test_a_schedule_of_an_unknown_task_is_refused_with_the_close_names():
    registry, _ = registry_with("refresh-rates")
    with pytest.raises(pgworker.ConfigError, match="did you mean 'refresh-rates'") as caught:
        registry.periodic("refresh-rate", "*/5 * * * *")
    assert caught.value.field == "task"
    _other, handle = registry_with("refresh-rates")
    with pytest.raises(pgworker.ConfigError) as caught:
        registry.periodic(handle, every=60)  # a handle of another registry
    assert caught.value.field == "task"


def test_the_task_by_name_or_handle_with_its_defaults_and_names_that_tell_schedules_apart():
    registry, handle = registry_with("refresh-rates")
    by_name = registry.periodic("refresh-rates", "*/5 * * * *", timezone="Europe/Paris")
    assert (by_name.name, by_name.task, by_name.queue, by_name.priority) == (
        "refresh-rates",
        "refresh-rates",
        "ticks",
        20,
    )
    assert by_name.definition == "cron */5 * * * * Europe/Paris"
    with pytest.raises(pgworker.ConfigError, match="already registered") as caught:
        registry.periodic(handle, every=60)
    assert caught.value.field == "name"
    hourly = registry.periodic(
        handle, every=timedelta(hours=1), name="hourly", queue="q", priority=3, payload={"a": 1}
    )
    assert (hourly.every, hourly.queue, hourly.priority, hourly.payload) == (
        3600,
        "q",
        3,
        '{"a":1}',
    )
    assert [s.name for s in registry.schedules()] == ["hourly", "refresh-rates"]
    six = registry.periodic(handle, "*/10  * * * * *", name="six")
    assert six.cron == "*/10 * * * * *"  # blanks made single: part of the stored definition


def test_the_key_is_the_name_and_the_slot_in_iso_8601_utc():
    slot = datetime(2027, 3, 28, 3, 0, tzinfo=PARIS)
    assert key("refresh-rates", slot) == "periodic:refresh-rates:2027-03-28T01:00:00Z"


# --- slots, on a clock the test sets ------------------------------------------------------------


def schedule(cron: str | None = None, **options: Any) -> Any:
    registry, _ = registry_with("tick")
    return registry.periodic("tick", cron, **options)


def test_every_slots_are_multiples_of_the_period_since_the_epoch():
    s = schedule(every=60)
    assert s.next_after(datetime(2027, 1, 1, 10, 0, 30, tzinfo=UTC)) == datetime(
        2027, 1, 1, 10, 1, tzinfo=UTC
    )
    assert s.next_after(datetime(2027, 1, 1, 10, 1, tzinfo=UTC)) == datetime(
        2027, 1, 1, 10, 2, tzinfo=UTC
    )
    back = s.slots_back(
        datetime(2027, 1, 1, 10, 0, tzinfo=UTC), datetime(2027, 1, 1, 10, 3, tzinfo=UTC), 10
    )
    assert back == [datetime(2027, 1, 1, 10, m, tzinfo=UTC) for m in (3, 2, 1, 0)]


def test_dst_spring_forward_a_0230_slot_runs_at_0300_once():
    """Europe/Paris, 2027-03-28: 02:00 becomes 03:00, so 02:30 does not exist that day. A daily
    02:30 slot (5 fields) runs at 03:00 local time (01:00 UTC) that day, as Debian's cron runs
    the jobs of a skipped hour at once; the days around keep 02:30."""
    s = schedule("30 2 * * *", timezone="Europe/Paris")
    slots = s.slots_back(
        datetime(2027, 3, 27, tzinfo=PARIS), datetime(2027, 3, 29, 12, tzinfo=PARIS), 10
    )[::-1]
    assert [x.astimezone(PARIS).isoformat() for x in slots] == [
        "2027-03-27T02:30:00+01:00",
        "2027-03-28T03:00:00+02:00",
        "2027-03-29T02:30:00+02:00",
    ]
    assert s.next_after(datetime(2027, 3, 28, 0, tzinfo=UTC)) == datetime(
        2027, 3, 28, 1, tzinfo=UTC
    )
    # A slot that does not exist on the wall clock is skipped with 6 fields (seconds), which
    # follow the wall clock strictly (no Debian special case).
    six = schedule("0 30 2 * * *", timezone="Europe/Paris")
    assert six.next_after(datetime(2027, 3, 27, 12, tzinfo=PARIS)).astimezone(PARIS) == datetime(
        2027, 3, 29, 2, 30, tzinfo=PARIS
    )


def test_dst_fall_back_a_0230_slot_runs_once_not_twice():
    """Europe/Paris, 2027-10-31: 03:00 goes back to 02:00, so 02:30 happens twice; the daily
    slot runs once, at the first 02:30 (summer time, 00:30 UTC)."""
    s = schedule("30 2 * * *", timezone="Europe/Paris")
    slots = s.slots_back(
        datetime(2027, 10, 30, 12, tzinfo=PARIS), datetime(2027, 11, 1, 12, tzinfo=PARIS), 10
    )[::-1]
    assert [x.isoformat() for x in slots] == [
        "2027-10-31T00:30:00+00:00",
        "2027-11-01T01:30:00+00:00",
    ]
    # The leader passing at each minute of that night enqueues it once.
    night = [datetime(2027, 10, 30, 23, 0, tzinfo=UTC) + timedelta(minutes=m) for m in range(240)]
    assert passes(s, night) == [datetime(2027, 10, 31, 0, 30, tzinfo=UTC)]


def test_dst_expressions_on_the_clock_as_it_is_skip_and_repeat():
    """Not Debian's special case: a minute or hour field starting with `*`, or 6 fields."""
    half_hourly = schedule("*/30 * * * *", timezone="Europe/Paris")
    spring = half_hourly.slots_back(
        datetime(2027, 3, 28, 1, 30, tzinfo=PARIS), datetime(2027, 3, 28, 3, 0, tzinfo=PARIS), 10
    )
    assert [x.astimezone(PARIS).strftime("%H:%M") for x in spring[::-1]] == ["01:30", "03:00"]
    fall = half_hourly.slots_back(
        datetime(2027, 10, 31, 0, 0, tzinfo=UTC), datetime(2027, 10, 31, 1, 30, tzinfo=UTC), 10
    )
    assert [x.astimezone(PARIS).strftime("%H:%M%z") for x in fall[::-1]] == [
        "02:00+0200",
        "02:30+0200",
        "02:00+0100",
        "02:30+0100",
    ]
    six = schedule("0 30 2 * * *", timezone="Europe/Paris")
    twice = six.slots_back(
        datetime(2027, 10, 30, 12, tzinfo=PARIS), datetime(2027, 10, 31, 12, tzinfo=PARIS), 10
    )
    assert [x.isoformat() for x in twice[::-1]] == [
        "2027-10-31T00:30:00+00:00",
        "2027-10-31T01:30:00+00:00",
    ]


def passes(s: Any, clock: list[datetime]) -> list[datetime]:
    """What a leader that passes at each moment of `clock` enqueues, from the first one on."""
    enqueued: list[datetime] = []
    start = s.next_after(clock[0])
    for now in clock[1:]:
        if start <= now:
            enqueued += s.due(start, now, grace=30.0).slots
            start = s.next_after(now)
    return enqueued


def test_dst_spring_forward_over_a_leader_passing_each_minute():
    s = schedule("30 2 * * *", timezone="Europe/Paris")
    night = [datetime(2027, 3, 27, 23, 0, tzinfo=UTC) + timedelta(minutes=m) for m in range(240)]
    assert passes(s, night) == [datetime(2027, 3, 28, 1, 0, tzinfo=UTC)]


def test_catch_up_policies_choose_among_the_missed_slots():
    s_all, s_latest, s_none = (
        schedule(every=60, catch_up=policy) for policy in ("all", "latest", "none")
    )
    start = datetime(2027, 1, 1, 10, 0, tzinfo=UTC)  # the first slot not dealt with
    now = datetime(2027, 1, 1, 10, 10, 5, tzinfo=UTC)  # back after ten minutes
    minutes = [start + timedelta(minutes=m) for m in range(11)]
    assert s_all.due(start, now, grace=90).slots == minutes
    # Slots at most 90 s old are on time (10:09 and 10:10); of the missed ones, the last.
    latest = s_latest.due(start, now, grace=90)
    assert latest.slots == minutes[8:] and latest.skipped == 8
    none = s_none.due(start, now, grace=90)
    assert none.slots == minutes[9:] and none.skipped == 9
    assert s_none.due(start, start + timedelta(seconds=1), grace=90).slots == [start]


def test_catch_up_all_is_capped_at_1000_most_recent():
    s = schedule(every=1, catch_up="all")
    start = datetime(2027, 1, 1, tzinfo=UTC)
    now = start + timedelta(hours=1)
    due = s.due(start, now, grace=1)
    assert due.capped and len(due.slots) == MAX_CATCH_UP
    assert due.slots[-1] == now and due.slots[0] == now - timedelta(seconds=MAX_CATCH_UP - 1)


def test_the_lease_name_follows_the_schedule_set():
    registry, handle = registry_with("tick")
    a = registry.periodic(handle, every=1, name="a")
    b = registry.periodic(handle, every=2, name="b")
    other, other_handle = registry_with("tick")
    other_a = other.periodic(other_handle, every=1, name="a")
    assert set_name([a, b]) == set_name([b, a]) != set_name([other_a])
    assert set_name([a]) == set_name([other_a])


# --- on a database ------------------------------------------------------------------------------


async def jobs_of(conn: Any, name: str) -> list[Any]:
    return await conn.fetch(
        "SELECT id, status, scheduled_at, idempotency_key, result::text AS result, created_at,"
        " queue, priority FROM pgworker.jobs WHERE idempotency_key LIKE $1 ORDER BY scheduled_at",
        f"periodic:{name}:%",
    )


@aio
async def test_the_slot_reaches_the_handler_as_scheduled_at(dsn: str, conn: Any):
    registry, handle = registry_with("tick")
    registry.periodic(handle, every=1, payload={"hello": "world"})
    started = await conn.fetchval("SELECT now()")
    async with pgworker.Worker(registry, dsn, lease=4.0, poll_interval=0.2):
        done = await wait_for(
            lambda: conn.fetch(
                "SELECT * FROM pgworker.jobs WHERE status = 'completed' AND type = 'tick'"
            ),
            timeout=20,
        )
    job = done[0]
    slot = job["scheduled_at"]
    assert slot > started  # the first start catches nothing up
    assert job["idempotency_key"] == key("tick", slot)
    assert json.loads(job["result"]) == {"scheduled_at": slot.isoformat()}
    assert json.loads(job["payload"]) == {"hello": "world"}
    assert (job["queue"], job["priority"], job["run_at"]) == ("ticks", 20, slot)
    got = await pgworker.get_job(conn, job["id"])
    assert got is not None and got.scheduled_at == slot
    plain = await pgworker.enqueue(conn, "tick", {})
    assert plain.job.scheduled_at is None
    row = await conn.fetchrow("SELECT * FROM pgworker.periodic")
    assert row["name"] == "tick" and row["schedule"] == "every 1s"
    assert row["next_slot"] > row["last_slot"] >= slot


@aio
async def test_run_job_takes_a_scheduled_at():
    registry, _ = registry_with("tick")
    slot = datetime(2027, 3, 28, 1, tzinfo=UTC)
    run = await pgworker.testing.run_job(registry, "tick", scheduled_at=slot)
    assert run.result == {"scheduled_at": slot.isoformat()}


@aio
async def test_a_schedule_removed_from_the_code_stops_and_two_fleets_each_run_their_own(
    dsn: str, conn: Any
):
    """Fleet A defines `both` and `a-only`; fleet B, run beside it, `both` and `b-only`: each
    fleet's schedules are enqueued (two leases, one per set) and `both` once per slot. Then A
    stops: `a-only`, defined by no fleet left, is no longer enqueued; its row stays."""
    fleet_a, handle_a = registry_with("tick")
    fleet_a.periodic(handle_a, every=1, name="both")
    fleet_a.periodic(handle_a, every=1, name="a-only")
    fleet_b, handle_b = registry_with("tick")
    fleet_b.periodic(handle_b, every=1, name="both")
    fleet_b.periodic(handle_b, every=1, name="b-only")
    options: dict[str, Any] = {"lease": 4.0, "poll_interval": 0.2}
    async with pgworker.Worker(fleet_b, dsn, **options):
        async with pgworker.Worker(fleet_a, dsn, **options):
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(DISTINCT name) = 2 FROM pgworker.leader"
                    " WHERE name LIKE 'periodic:%'"
                ),
                timeout=20,
            )
            for name in ("both", "a-only", "b-only"):
                await wait_for(lambda name=name: count_of(conn, name, 3), timeout=20)
        stopped = await conn.fetchval("SELECT now()")
        after = (await jobs_of(conn, "b-only"))[-1]["scheduled_at"]
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) >= 3 FROM pgworker.jobs"
                " WHERE idempotency_key LIKE 'periodic:b-only:%' AND scheduled_at > $1",
                after,
            ),
            timeout=20,
        )
    late = [j for j in await jobs_of(conn, "a-only") if j["created_at"] > stopped]
    assert late == []
    both = [j["scheduled_at"] for j in await jobs_of(conn, "both")]
    assert len(both) == len(set(both))
    rows = {r["name"] for r in await conn.fetch("SELECT name FROM pgworker.periodic")}
    assert rows == {"both", "a-only", "b-only"}


async def count_of(conn: Any, name: str, n: int) -> bool:
    return len(await jobs_of(conn, name)) >= n


class Clock:
    """The periodic service's clock, set by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@aio
async def test_dst_on_the_database_with_the_service_on_a_set_clock(
    dsn: str, conn: Any, monkeypatch: pytest.MonkeyPatch
):
    """The real service, its clock set to the nights of 2027's DST changes in Europe/Paris and
    moved a minute at a time: a daily 02:30 slot is enqueued once each night, at 03:00 local time
    on the spring-forward day and at the first 02:30 on the fall-back day."""
    registry, handle = registry_with("tick")
    schedule = registry.periodic(handle, "30 2 * * *", timezone="Europe/Paris", name="daily")
    pool = await pgworker_pool(dsn)
    try:
        settings = Settings(dsn=dsn, worker_id="dst-test", lease=60.0)
        service = Periodic(pool, settings, [schedule])
        for night in (
            datetime(2027, 3, 27, 23, tzinfo=UTC),
            datetime(2027, 10, 30, 23, tzinfo=UTC),
        ):
            clock = Clock(night)
            monkeypatch.setattr(service, "now", clock)
            service._renew_at = 0.0
            await conn.execute("DELETE FROM pgworker.periodic")
            await service.step()  # takes the lease, starts from the clock's now
            assert service.leading
            for _ in range(240):
                clock.now += timedelta(minutes=1)
                await service.step()
    finally:
        await pool.close()
    slots = [j["scheduled_at"] for j in await jobs_of(conn, "daily")]
    assert slots == [
        datetime(2027, 3, 28, 1, tzinfo=UTC),
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC),
    ]


async def pgworker_pool(dsn: str) -> Any:
    import asyncpg

    return await asyncpg.create_pool(dsn, min_size=1, max_size=2)


@aio
async def test_two_leaders_in_a_handover_enqueue_each_slot_once(dsn: str, conn: Any):
    """Exactly once rests on the idempotency key: a leader that believes it still leads after
    its lease was taken writes nothing (fenced), and a second leader over the same slots inserts
    none twice."""
    registry, handle = registry_with("tick")
    schedule = registry.periodic(handle, every=1, name="once", catch_up="all")
    pool = await pgworker_pool(dsn)
    try:
        first = Periodic(pool, Settings(dsn=dsn, worker_id="first", lease=60.0), [schedule])
        second = Periodic(pool, Settings(dsn=dsn, worker_id="second", lease=60.0), [schedule])
        clock = Clock(datetime(2027, 1, 1, tzinfo=UTC))
        first.now = second.now = clock  # type: ignore[method-assign]
        await first.step()
        clock.now += timedelta(seconds=5)
        assert await first.enqueue_due() == 5
        # The lease expires; `second` takes over and goes on from the row, fenced out `first`.
        await conn.execute("UPDATE pgworker.leader SET expires_at = now() - interval '1 second'")
        await second.step()
        assert second.leading
        clock.now += timedelta(seconds=3)
        assert await first.enqueue_due() == 0 and not first.leading
        assert await second.enqueue_due() == 3
        # A second leader that starts over from an older point inserts no slot twice.
        second._next["once"] = datetime(2027, 1, 1, 0, 0, 1, tzinfo=UTC)
        assert await second.enqueue_due() == 0
    finally:
        await pool.close()
    slots = [j["scheduled_at"] for j in await jobs_of(conn, "once")]
    assert slots == [datetime(2027, 1, 1, tzinfo=UTC) + timedelta(seconds=n) for n in range(1, 9)]
    assert grace(60.0) == 65.0


@aio
async def test_the_leader_wakes_at_each_slot_not_at_its_maintenance_tick(dsn: str, conn: Any):
    """With a 10 s lease the maintenance tick is 5 s; a one-second schedule's jobs are still
    enqueued about when their slot falls (a leader that woke only at its tick would be 2.5 s late
    on the median)."""
    registry, handle = registry_with("tick")
    registry.periodic(handle, every=1)
    async with pgworker.Worker(registry, dsn, lease=10.0, poll_interval=0.5):
        await wait_for(lambda: count_of(conn, "tick", 8), timeout=30)
    jobs = await jobs_of(conn, "tick")
    lags = sorted((j["created_at"] - j["scheduled_at"]).total_seconds() for j in jobs)
    assert lags[len(lags) // 2] < 1.0, lags


# --- pgworker periodic list, GET /periodic, the dashboard's page -------------------------------


@aio
async def test_periodic_list_in_the_cli_the_http_api_and_the_dashboard(dsn: str, conn: Any):
    registry, handle = registry_with("tick")
    registry.periodic(handle, every=1, name="tick\x1b[2J<b>bold</b>")
    registry.periodic(handle, "0 3 * * *", name="nightly", timezone="Europe/Paris")
    async with pgworker.Worker(registry, dsn, lease=4.0, poll_interval=0.2):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs WHERE status = 'completed' AND scheduled_at ="
                " (SELECT last_slot FROM pgworker.periodic WHERE name LIKE 'tick%')"
            ),
            timeout=20,
        )
    row = await conn.fetchrow("SELECT * FROM pgworker.periodic WHERE name LIKE 'tick%'")
    listed = await pgworker.list_periodic(conn)
    assert [s.name for s in listed] == ["nightly", row["name"]]
    nightly, tick = listed
    assert (nightly.last_slot, nightly.last_job_id, nightly.schedule) == (
        None,
        None,
        "cron 0 3 * * * Europe/Paris",
    )
    assert nightly.next_slot.astimezone(PARIS).hour == 3
    assert tick.last_slot == row["last_slot"] and tick.last_job_status == "completed"

    table = cli("periodic", "list", "--dsn", dsn)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["name", "task", "schedule"]
    assert "\x1b" not in table.stdout and "tick\\x1b[2J<b>bold</b>" in table.stdout
    assert f"{tick.last_job_id} completed" in table.stdout
    assert row["last_slot"].strftime("%Y-%m-%dT%H:%M:%SZ") in table.stdout
    as_json = cli("periodic", "list", "--json", "--dsn", dsn)
    assert as_json.returncode == 0, as_json.stderr
    found = json.loads(as_json.stdout)
    assert [s["name"] for s in found] == ["nightly", row["name"]]
    assert found[1]["last_slot"] == row["last_slot"].isoformat()
    assert set(found[1]) == {
        "name",
        "task",
        "schedule",
        "last_slot",
        "next_slot",
        "last_job_id",
        "last_job_status",
        "checked_at",
    }
    wrong = cli("periodic", "list", "--limit", "0", "--dsn", dsn)
    assert wrong.returncode == 2 and wrong.stderr.startswith("pgworker periodic list: error: limit")
    assert len(wrong.stderr.strip().splitlines()) == 1

    from .test_dashboard import http
    from .webserver import serving

    async with serving(dsn) as served:
        async with served.client() as client:
            answer = await client.get("/periodic")
        assert answer.status_code == 200, answer.text
        schedules = answer.json()["schedules"]
        assert [s["name"] for s in schedules] == ["nightly", row["name"]]
        assert schedules[1]["last_job_status"] == "completed"
        async with http(served) as client:
            page = await client.get("/ui/periodic")
        assert page.status_code == 200
        assert "&lt;b&gt;bold&lt;/b&gt;" in page.text and "<b>bold</b>" not in page.text
        assert "cron 0 3 * * * Europe/Paris" in page.text


@aio
async def test_a_stopping_worker_gives_the_lease_up_and_does_not_spin(dsn: str, conn: Any):
    registry, handle = registry_with("tick")
    schedule = registry.periodic(handle, every=1)
    pool = await pgworker_pool(dsn)
    stopping = False
    try:
        service = Periodic(
            pool, Settings(dsn=dsn, worker_id="w", lease=60.0), [schedule], lambda: stopping
        )
        await service.step()
        assert service.leading and 0 < service.wait() <= 1.1
        stopping = True
        service._renew_at = 0.0  # a renewal due: a stopping worker must not look at once
        await service.step()
        assert not service.leading
        assert await conn.fetchval("SELECT count(*) FROM pgworker.leader") == 0
        assert service.wait() > 1.0  # the next look is at the next renewal, not at once
    finally:
        await pool.close()


@aio
async def test_the_periodic_table_privileges_are_needed_only_by_workers_with_schedules(
    dsn: str, conn: Any
):
    """A role granted the tables every worker needs (but `periodic`) runs workers without
    schedules as before; a worker with schedules says in one PrivilegeError which grant it
    lacks."""
    import uuid

    name = f"pgw_role_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {name} LOGIN")
    try:
        await conn.execute(f"GRANT USAGE ON SCHEMA pgworker TO {name}")
        await conn.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON pgworker.jobs, pgworker.job_attempts,"
            f" pgworker.workers, pgworker.leader, pgworker.migrations TO {name}"
        )
        await conn.execute(f"GRANT SELECT ON pgworker.queues TO {name}")
        # Every worker's claim since migration 15 (limits; docs/operations/upgrading.md).
        await conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON pgworker.rate_windows TO {name}; "
            f"GRANT SELECT, INSERT, UPDATE ON pgworker.key_cursors TO {name}"
        )
        role_dsn = dsn.replace("//postgres@", f"//{name}@", 1)
        plain, _ = registry_with("tick")
        async with pgworker.Worker(plain, role_dsn, lease=4.0):
            pass
        scheduled, handle = registry_with("tick")
        scheduled.periodic(handle, every=1)
        with pytest.raises(pgworker.PrivilegeError, match=r"on pgworker\.periodic"):
            async with pgworker.Worker(scheduled, role_dsn, lease=4.0):
                pytest.fail("the worker started without its privileges")
    finally:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        await conn.execute(f"DROP OWNED BY {name}")
        await conn.execute(f"DROP ROLE {name}")


@aio
async def test_catch_up_all_over_1000_missed_slots_enqueues_the_last_1000_and_says_so(
    dsn: str, conn: Any
):
    registry, handle = registry_with("tick")
    schedule = registry.periodic(handle, every=1, name="owed", catch_up="all")
    pool = await pgworker_pool(dsn)
    # structlog's own capture, around the service's making (its logger is bound then): the
    # warning reaches no stdlib handler once an earlier test has configured structlog.
    try:
        with capture_logs() as logs:
            service = Periodic(pool, Settings(dsn=dsn, worker_id="w", lease=60.0), [schedule])
            clock = Clock(datetime(2027, 1, 1, tzinfo=UTC))
            service.now = clock  # type: ignore[method-assign]
            await service.step()
            clock.now += timedelta(seconds=1500)  # 1,500 slots due, 1,435 of them missed
            assert await service.enqueue_due() == MAX_CATCH_UP
        [capped] = [e for e in logs if "more than 1,000 slots missed" in e["event"]]
        assert capped["log_level"] == "warning" and capped["schedule"] == "owed"
    finally:
        await pool.close()
    slots = [j["scheduled_at"] for j in await jobs_of(conn, "owed")]
    assert slots[0] == clock.now - timedelta(seconds=MAX_CATCH_UP - 1) and slots[-1] == clock.now


# --- schedules and rows a hostile operator writes --------------------------------------------


# What a psql session can store in a timestamptz but Python's datetime cannot hold: asyncpg gives
# naive datetimes for the infinities, and raises OverflowError for a year BC or after 9999.
HOSTILE_TIMES = ("-infinity", "infinity", "0044-03-15 BC", "10000-01-01 00:00:00+00")


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
            done = cli(*args, *extra, "--dsn", dsn)
            assert done.returncode == 0, done.stderr
            assert "Traceback" not in done.stderr
            if extra:
                json.loads(done.stdout)
    pause = cli("queue", "pause", "q1", "--dsn", dsn)
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
