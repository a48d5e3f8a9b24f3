"""The charts' per-minute rollup (migration 24): the maintenance leader rolls closed minutes up
from job_attempts and jobs, and GET /stats reads them from it and only the rest from
job_attempts. The same numbers either way for a seeded hour; rolling a minute up again changes
nothing; the minutes not rolled up (the tail, attempts still running) are read directly; more
than DIRECT_MINUTES missing are said (`unread_minutes`); the rollup is pruned with the finished
jobs' retention; percentiles are within HISTOGRAM_ERROR of the exact nearest-rank ones."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import pgworker
from pgworker._db.queries import queries
from pgworker._maintenance import rollup as _rollup
from pgworker._maintenance.maintenance import Maintenance
from pgworker._web import charts

from .helpers import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

q = queries("pgworker")
COUNTS = ("enqueued", "completed", "failed")
SERIES = (*COUNTS, "wait_p50", "wait_p95", "run_p50", "run_p95")


async def _job(
    conn: Any,
    queue: str,
    type_: str,
    at: datetime,
    outcomes: list[str],
    wait: float,
    run: float,
) -> int:
    """A job created at `at` whose attempts (one per outcome) each waited `wait` and ran `run`
    seconds, its last attempt claimed at `at` + `wait` (the earlier ones 1 ms apart before)."""
    last = outcomes[-1]
    status = last if last in ("running", "completed") else "failed"
    started = at + timedelta(seconds=wait)
    job_id: int = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, queue, status, attempts, run_at, created_at,"
        " claimed_at, finished_at) VALUES ($1, $2, $3, $4, $5, $5, $6, $6) RETURNING id",
        type_,
        queue,
        status,
        len(outcomes),
        at,
        started,
    )
    for n, outcome in enumerate(outcomes, 1):
        begin = started - timedelta(milliseconds=len(outcomes) - n)
        await conn.execute(
            "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,"
            " correlation_id, outcome, started_at, finished_at)"
            " VALUES ($1, $2, $3, $4, 'w', 'c', $5, $6, $7)",
            job_id,
            n,
            type_,
            queue,
            outcome,
            begin,
            None if outcome == "running" else begin + timedelta(seconds=run),
        )
    return job_id


async def _seed(conn: Any, minutes_ago: int = 40, minutes: int = 30) -> list[tuple[float, float]]:
    """Jobs over `minutes` minutes ending `minutes_ago` minutes back, in two queues and two
    types, with waits and runs spread over six decades; returns each attempt's (wait, run)."""
    start = (datetime.now(UTC) - timedelta(minutes=minutes_ago)).replace(second=0, microsecond=0)
    seen: list[tuple[float, float]] = []
    outcomes = (["completed"], ["failed"], ["retried", "completed"], ["timed_out"], ["lost"])
    for i in range(minutes * 4):
        at = start + timedelta(seconds=15 * i + 1)
        wait = 0.00005 * 1.7 ** (i % 23)
        run = 0.0003 * 1.9 ** (i % 17)
        kind = outcomes[i % len(outcomes)]
        await _job(conn, f"q{i % 2}", f"t{i % 3}", at, kind, wait, run)
        seen.append((wait, run))
    return seen


async def _early(conn: Any, second: str) -> bool:
    return bool(await conn.fetchval(second) < 35)


async def _roll_all(conn: Any) -> int:
    done = 0
    for _ in range(100):  # 1,440 minutes, 60 at a time
        due = await q.stats_rollup_due(conn, 60.0, 600.0, 86400.0, 60)
        if not due:
            return done
        for minute in due:
            await q.stats_rollup(conn, minute, None)
            done += 1
    raise AssertionError("the rollup never caught up")


async def _answers(conn: Any) -> dict[tuple[str, str | None, str | None], dict[str, Any]]:
    cases = [
        (window, queue, type_)
        for window in ("hour", "day")
        for queue, type_ in ((None, None), ("q1", None), (None, "t2"), ("q0", "t1"))
    ]
    return {c: await charts.stats(conn, q, *c) for c in cases}


def _nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


async def test_the_rollup_gives_the_numbers_of_the_direct_read_and_again_when_redone(conn):
    # The direct read and the rollup's are compared bucket by bucket: both within one minute of
    # the server's clock, else the buckets shift between them. Begun early in a minute.
    second = "SELECT extract(second FROM clock_timestamp())"
    if await conn.fetchval(second) > 35:
        await wait_for(lambda: _early(conn, second), timeout=30, every=0.2)
    seen = await _seed(conn)
    direct = await _answers(conn)
    assert direct["hour", None, None]["totals"] == {"enqueued": 120, "completed": 48, "failed": 96}
    assert direct["hour", None, None]["unread_minutes"] == 0
    assert await conn.fetchval("SELECT count(*) FROM pgworker.stats_rollup") == 0

    started = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
    rolled = await _roll_all(conn)
    ended = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")
    # Every closed minute of the day, the empty ones too: 1,439, and one more for each minute
    # that closed while the loop ran (on a busy machine, more than one).
    closed_meanwhile = math.floor(ended / 60) - math.floor(started / 60)
    assert 1440 - 1 <= rolled <= 1440 - 1 + closed_meanwhile + 1
    before = await conn.fetch("SELECT * FROM pgworker.stats_minutes ORDER BY queue, type, minute")
    assert len(before) > 30
    from_rollup = await _answers(conn)
    for case, answer in direct.items():
        for name in (*SERIES, "totals"):
            assert from_rollup[case][name] == answer[name], (case, name)
        assert from_rollup[case]["unread_minutes"] == 0
        # Without the rollup, the day's minutes beyond the newest DIRECT_MINUTES were not read
        # (nothing was seeded there).
        unread = 0 if case[0] == "hour" else len(answer["at"]) * 10 - charts.DIRECT_MINUTES
        assert abs(answer["unread_minutes"] - unread) <= 10, case

    # Rolling each minute up again (a crash, another leader) writes the same rows.
    for minute in {r["minute"] for r in before}:
        await q.stats_rollup(conn, minute, None)
    again = await conn.fetch("SELECT * FROM pgworker.stats_minutes ORDER BY queue, type, minute")
    assert [dict(r) for r in again] == [dict(r) for r in before]
    assert (await _answers(conn)) == from_rollup

    # Percentiles: within HISTOGRAM_ERROR of the exact nearest-rank value of each bucket.
    hour = from_rollup["hour", None, None]
    waits = [w for w, _ in seen]  # every job's latest attempt has its wait
    assert hour["wait_p95"].count(None) < 60
    whole = charts.percentile
    assert whole(0.5, [], [], None, None) is None
    for p, name in ((0.5, "p50"), (0.95, "p95")):
        exact = _nearest_rank(waits, p)
        hist: dict[int, int] = {}
        for w in waits:
            hist[charts.bucket_of(w)] = hist.get(charts.bucket_of(w), 0) + 1
        got = whole(p, sorted(hist), [hist[b] for b in sorted(hist)], min(waits), max(waits))
        assert got is not None and abs(got - exact) <= charts.HISTOGRAM_ERROR * exact, name
    for i, t in enumerate(hour["at"]):
        if hour["run_p50"][i] is None:
            continue
        runs = [
            r["run"]
            for r in await conn.fetch(
                "SELECT date_part('epoch', finished_at - started_at) AS run"
                " FROM pgworker.job_attempts WHERE started_at >= to_timestamp($1)"
                " AND started_at < to_timestamp($1) + interval '1 minute'",
                t,
            )
        ]
        for p, name in ((0.5, "run_p50"), (0.95, "run_p95")):
            exact = _nearest_rank(runs, p)
            assert abs(hour[name][i] - exact) <= charts.HISTOGRAM_ERROR * exact + 1e-9, name


async def test_the_tail_and_minutes_with_running_attempts_are_read_from_job_attempts(conn):
    now = datetime.now(UTC)
    old = (now - timedelta(minutes=20)).replace(second=0, microsecond=0)
    running = await _job(conn, "q0", "t0", old, ["running"], 1.0, 0.2)
    await _job(conn, "q0", "t0", old, ["completed"], 1.0, 0.2)
    await _roll_all(conn)
    assert (
        await conn.fetchval("SELECT running FROM pgworker.stats_rollup WHERE minute = $1", old) == 1
    )
    # The running attempt completes after its minute was rolled up: counted at once.
    await conn.execute(
        "UPDATE pgworker.job_attempts SET outcome = 'completed',"
        " finished_at = started_at + interval '2 s' WHERE job_id = $1",
        running,
    )
    # And the current minute, not rolled up yet, counts too.
    await pgworker.enqueue(conn, "t0", {}, queue="q0")
    tail = await _job(conn, "q0", "t0", now - timedelta(seconds=1), ["failed"], 0.5, 0.1)
    answer = await charts.stats(conn, q, "hour", "q0", None)
    assert answer["totals"] == {"enqueued": 4, "completed": 2, "failed": 1}
    assert tail and answer["unread_minutes"] == 0
    i = answer["at"].index(int(old.timestamp()))
    assert answer["completed"][i] == 2 and answer["run_p95"][i] == pytest.approx(2.0)
    # Rolled up again (a minute later), the rollup has it, and the read is the same.
    await conn.execute("UPDATE pgworker.stats_rollup SET rolled_at = rolled_at - interval '2 min'")
    await _roll_all(conn)
    assert (
        await conn.fetchval("SELECT running FROM pgworker.stats_rollup WHERE minute = $1", old) == 0
    )
    again = await charts.stats(conn, q, "hour", "q0", None)
    assert again["completed"] == answer["completed"]
    assert again["run_p95"] == answer["run_p95"]


async def test_minutes_beyond_the_direct_bound_are_said_unread(conn, monkeypatch):
    await _seed(conn, minutes_ago=30, minutes=10)
    monkeypatch.setattr(charts, "DIRECT_MINUTES", 5)
    answer = await charts.stats(conn, q, "hour", None, None)
    assert answer["totals"]["completed"] == 0 and answer["unread_minutes"] == 60 - 5
    await _roll_all(conn)
    answer = await charts.stats(conn, q, "hour", None, None)
    assert answer["unread_minutes"] == 0 and answer["totals"]["completed"] == 16


async def test_the_leader_rolls_up_and_prunes_with_the_retention(dsn, pool, monkeypatch):
    await _seed(pool, minutes_ago=30, minutes=5)
    settings = pgworker.Settings(dsn=dsn, worker_id="leader", retain_completed=3600.0)
    leader = Maintenance(pool, settings)
    monkeypatch.setattr(_rollup, "ROLLUP_MINUTES", 500)
    for _ in range(100):  # each round rolls up what its time allows, newest first
        await leader.tick()
        if not leader.rollup.behind:
            break
    assert await pool.fetchval("SELECT count(*) FROM pgworker.stats_rollup") == 1439
    # A follower writes nothing (the leadership's fence).
    newest = await pool.fetchval(
        "DELETE FROM pgworker.stats_rollup"
        " WHERE minute = (SELECT max(minute) FROM pgworker.stats_rollup) RETURNING minute"
    )
    assert (await q.stats_rollup(pool, newest, "follower"))["written"] == 0
    assert not await pool.fetchval(
        "SELECT count(*) FROM pgworker.stats_rollup WHERE minute = $1", newest
    )
    assert (await q.stats_rollup(pool, newest, "leader"))["attempts"] >= 0
    assert await pool.fetchval(
        "SELECT count(*) FROM pgworker.stats_rollup WHERE minute = $1", newest
    )
    # Minutes older than the retention (a day at least) are forgotten at the periodic prune.
    await pool.execute(
        "INSERT INTO pgworker.stats_rollup (minute, rolled_at, running)"
        " SELECT m, now(), 0 FROM generate_series(now() - interval '3 days',"
        " now() - interval '2 days', interval '1 minute') AS m"
    )
    assert await q.stats_prune(pool, 86400.0, 100_000) >= 1441
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgworker.stats_rollup WHERE minute < now() - interval '1 day'"
        )
        == 0
    )


async def test_minutes_before_the_oldest_job_are_marked_empty_and_its_own_are_not(conn):
    """A new install does not roll up a day of empty minutes one statement each: those that
    ended before the oldest job was created (less the recheck delay) are marked rolled up at
    once, empty; the oldest job's minute and those after it are rolled up as usual."""
    now = await conn.fetchval("SELECT date_bin('1 minute', now(), 'epoch')")
    oldest = now - timedelta(hours=2)
    await _job(conn, "q", "t", oldest + timedelta(seconds=5), ["completed"], 0.1, 0.1)
    await _job(conn, "q", "t", now - timedelta(minutes=30), ["completed"], 0.1, 0.1)
    recheck = _rollup.ROLLUP_RECHECK
    marked = await q.stats_rollup_empty(conn, None, _rollup.ROLLUP_REACH, recheck)
    bound = await conn.fetchval("SELECT max(minute) FROM pgworker.stats_rollup")
    assert marked > 1000
    assert bound < oldest - timedelta(seconds=recheck), (bound, oldest)
    assert bound >= oldest - timedelta(seconds=recheck + 120), (bound, oldest)
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.stats_minutes WHERE minute <= $1", bound
    )
    # Marked again: nothing more, and nothing of the minutes with jobs.
    assert await q.stats_rollup_empty(conn, None, _rollup.ROLLUP_REACH, recheck) == 0
    assert await conn.fetchval("SELECT max(minute) FROM pgworker.stats_rollup") == bound
