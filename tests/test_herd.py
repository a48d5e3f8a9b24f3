"""No thundering herd: idle workers take turns to claim and to poll, so that a fleet costs about
one claim per job and one poll per interval in all; a job whose chosen worker is full or gone
still starts within the documented bound (docs/scaling.md), and every job runs once. Claims are
counted by wrapping the one method that sends the claim statement."""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

import pgworker
from pgworker._db.queries import Queries, queries
from pgworker._runtime.turns import Pass, Turns, _peer

from .helpers import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

K = 6
POLL = 0.5
BOUND = 2 * POLL
"""The longest a job waits when its chosen worker cannot take it: one poll interval, two while
the worker due to poll is the one that is gone (docs/scaling.md)."""
SLACK = 2.0
"""For a loaded test machine: the broken promise waits forever, not a few seconds."""


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counted: Counter[str] = Counter()
    claim = Queries.job_claim

    async def counting(self: Queries, *args: Any, **kwargs: Any) -> Any:
        counted["claims"] += 1
        return await claim(self, *args, **kwargs)

    monkeypatch.setattr(Queries, "job_claim", counting)
    return counted


def turns_of(worker: pgworker.Worker) -> Turns:
    producer = worker._producer
    assert producer is not None and producer._turns is not None
    return producer._turns


@contextlib.asynccontextmanager
async def fleet(
    registry: pgworker.Registry, dsn: str, k: int = K, known: int | None = None, **options: Any
) -> AsyncIterator[list[pgworker.Worker]]:
    """`k` workers serving `dsn`, once each knows the `known` live workers (`k` unless told)."""
    options.setdefault("poll_interval", POLL)
    async with contextlib.AsyncExitStack() as stack:
        workers = [
            await stack.enter_async_context(
                pgworker.Worker(registry, dsn, worker_id=f"herd-{i}", **options)
            )
            for i in range(k)
        ]
        expected = known if known is not None else k
        await wait_for(lambda: all(turns_of(w).size == expected for w in workers), timeout=20)
        yield workers


def counting_registry(ran: Counter[int]) -> pgworker.Registry:
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        ran[ctx.job_id] += 1

    return registry


async def starts(conn: Any, ids: list[int]) -> list[float]:
    """Seconds from each job's creation to its first attempt's start (the database's clock)."""
    rows = await conn.fetch(
        "SELECT extract(epoch FROM min(a.started_at) - j.created_at)::float8 AS wait "
        "FROM pgworker.jobs j JOIN pgworker.job_attempts a ON a.job_id = j.id "
        "WHERE j.id = ANY($1::bigint[]) GROUP BY j.id",
        ids,
    )
    return [r["wait"] for r in rows]


async def ran_once(conn: Any, ids: list[int], ran: Counter[int]) -> None:
    assert all(ran[i] == 1 for i in ids), ran
    attempts = await conn.fetchval(
        "SELECT count(*) FROM pgworker.job_attempts WHERE job_id = ANY($1::bigint[])", ids
    )
    assert attempts == len(ids)


async def trickle(conn: Any, ran: Counter[int], n: int) -> list[int]:
    """Enqueue `n` jobs one at a time, each once the one before has run: each finds the fleet
    idle."""
    ids = []
    for i in range(n):
        job_id = (await pgworker.enqueue(conn, "t", {"n": i})).job.id
        ids.append(job_id)
        await wait_for(lambda job_id=job_id: ran[job_id], timeout=20)
    return ids


async def test_a_trickle_of_jobs_to_an_idle_fleet_costs_at_most_two_claims_each(dsn, conn, claims):
    ran: Counter[int] = Counter()
    async with fleet(counting_registry(ran), dsn):
        before = claims["claims"]
        ids = await trickle(conn, ran, 30)
        spent = claims["claims"] - before
    assert spent <= 2 * len(ids), f"{spent} claims for {len(ids)} jobs"
    await ran_once(conn, ids, ran)


async def test_an_idle_fleet_polls_about_once_per_poll_interval_in_all(dsn, claims):
    ran: Counter[int] = Counter()
    async with fleet(counting_registry(ran), dsn):
        before, t0 = claims["claims"], time.monotonic()
        await anyio.sleep(5.0)  # the window measured
        spent, elapsed = claims["claims"] - before, time.monotonic() - t0
    # About one claim per poll slot: a loaded machine delays polls, and a worker whose poll ran
    # late may meet the next one's slot (13 in 5 s seen once, beside other suites). K workers
    # each polling every interval would make K times as many (60 here).
    assert 1 <= spent <= 1.5 * elapsed / POLL + 2, f"{spent} claims in {elapsed:.1f}s"


async def test_a_job_whose_chosen_worker_is_full_starts_within_the_bound(dsn, conn, claims):
    ran: Counter[int] = Counter()
    registry = counting_registry(ran)
    release = anyio.Event()
    blocked = anyio.Event()

    @registry.task("block")
    async def block(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        blocked.set()
        await release.wait()

    async with fleet(registry, dsn, k=3, concurrency=1):
        await pgworker.enqueue(conn, "block", {})
        await blocked.wait()
        try:
            # One worker in three is full: about a third of these are its turn.
            ids = await trickle(conn, ran, 12)
        finally:
            release.set()
    waits = await starts(conn, ids)
    assert max(waits) <= BOUND + SLACK, waits
    await ran_once(conn, ids, ran)


async def test_a_job_whose_chosen_worker_died_starts_within_the_bound(dsn, conn, claims):
    """A worker killed without a word keeps its row, seen recently, until its lease runs out: it
    stays in everyone's list, and its turns fall to the polls."""
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency) "
        "VALUES ('herd-2-killed', 'gone', 1, '{default}', '{t}', 1)"
    )
    ran: Counter[int] = Counter()
    async with fleet(counting_registry(ran), dsn, k=3, known=4):
        ids = await trickle(conn, ran, 12)
    waits = await starts(conn, ids)
    assert max(waits) <= BOUND + SLACK, waits
    assert sorted(waits)[len(waits) // 2] < POLL  # most are not the dead worker's turn
    await ran_once(conn, ids, ran)


async def test_a_poll_that_finds_more_jobs_than_it_can_take_wakes_the_fleet(dsn, conn):
    """Jobs that became due come with no notification: the worker whose poll finds them wakes
    the others at once, rather than each joining at its own poll, `interval` apart."""
    interval = 4.0
    started: list[float] = []
    release = anyio.Event()
    registry = pgworker.Registry()

    @registry.task("t")
    async def hold(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        started.append(time.monotonic())
        await release.wait()

    async with fleet(registry, dsn, k=3, concurrency=2, poll_interval=interval):
        try:
            await pgworker.enqueue_many(
                conn, [pgworker.JobSpec("t", {"n": n}, delay=0.5) for n in range(12)]
            )
            await wait_for(lambda: len(started) == 6, timeout=3 * interval)
        finally:
            release.set()
    assert started[5] - started[0] < interval / 2, started


async def test_each_notification_is_the_turn_of_as_many_workers_as_jobs_arrived(conn):
    """The rule alone, over a list every worker shares: `count` workers claim (all of them when
    as many jobs arrived), only workers serving one of the jobs' types, a bare queue name wakes
    every worker of the queue, and a full worker passes its turn to the next ones (as the
    listener sends it)."""
    ids = [f"w{i}" for i in range(5)]
    served = {w: ["t"] if w != "w3" else ["other"] for w in ids}
    rows = [{"worker_id": w, "queues": ["default"], "types": served[w]} for w in ids]
    fleet = []
    for w in ids:
        settings = pgworker.Settings(dsn="postgresql://localhost/x", worker_id=w)
        turns = Turns(settings, served[w])
        turns._rows = [_peer(r["worker_id"], r["queues"], r["types"]) for r in rows]
        turns._apply()
        fleet.append(turns)

    def note(first: int, count: int, types: list[str] | None = None) -> str:
        return json.dumps({"queue": "default", "id": first, "count": count, "types": types})

    for first in range(1, 12):
        for count in (1, 2, 3, 7):
            assert sum(t.mine(note(first, count)) for t in fleet) == min(count, 5)
            chosen = [t for t in fleet if t.mine(note(first, count, ["t"]))]
            assert len(chosen) == min(count, 4) and fleet[3] not in chosen
    assert [t.mine("default") for t in fleet] == [True] * 5
    assert not any(t.mine("elsewhere") for t in fleet)
    hostile = ["[" * 5000, '{"queue": ["default"]}', '{"hello": 1}', "7", None, '{"queue": 1}']
    assert not any(t.mine(p) for t in fleet for p in hostile)
    mine = [t for t in fleet if t.mine(note(7, 1, ["t"]))]
    assert len(mine) == 1
    mine[0].full = lambda: True
    assert not mine[0].mine(note(7, 1, ["t"]))
    passed = await sent(conn, mine[0].take())
    assert len(passed) == 1 and json.loads(passed[0])["hops"] == 1
    taken = [t for t in fleet if t.mine(passed[0])]
    assert len(taken) == 1 and taken[0] is not mine[0]


async def sent(conn: Any, turns: list[Pass]) -> list[str]:
    """The payloads of these turns passed on, as the listener's connection sends them."""
    heard: list[str] = []

    def hear(*args: Any) -> None:
        heard.append(args[3])

    await conn.add_listener("pgworker_jobs", hear)
    try:
        for turn in turns:
            await queries("pgworker").jobs_pass(conn, *turn)
        await conn.execute("SELECT 1")  # a round trip delivers pending notifications
    finally:
        await conn.remove_listener("pgworker_jobs", hear)
    return heard


async def test_the_notification_of_new_jobs_keeps_its_bytes(conn):
    """Workers of an earlier release read the notifications of a fleet that runs this one (a
    rolling upgrade), and PostgreSQL folds equal ones within a transaction: the payload of an
    enqueue (a dependant's too, parked), of a dependant released, of a limited job's room and of
    a turn passed on are the text the enqueue trigger has always sent."""
    heard: list[str] = []

    def hear(*args: Any) -> None:
        heard.append(args[3])

    await conn.add_listener("pgworker_jobs", hear)
    try:
        one = await pgworker.enqueue(conn, "t", {}, queue="mail")
        two = await pgworker.enqueue_many(
            conn, [pgworker.JobSpec("a", {}), pgworker.JobSpec("b", {})]
        )
        child = await pgworker.enqueue(conn, "c", {}, after=[one.job.id])
        q = queries("pgworker")
        await conn.execute(
            "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() WHERE id = $1",
            one.job.id,
        )
        await q.jobs_announce(conn, [(7, "mail", "t"), (9, "mail", "t")])
        await q.jobs_pass(conn, "mail", 3, 2, None, None, 1)
        await conn.execute("SELECT 1")
    finally:
        await conn.remove_listener("pgworker_jobs", hear)
    first = two[0].job.id
    assert heard == [
        f'{{"queue" : "mail", "id" : {one.job.id}, "count" : 1, "types" : ["t"]}}',
        f'{{"queue" : "default", "id" : {first}, "count" : 2, "types" : null}}',
        f'{{"queue" : "default", "id" : {child.job.id}, "count" : 1, "types" : ["c"]}}',
        f'{{"queue" : "default", "id" : {child.job.id}, "count" : 1, "types" : ["c"]}}',  # released
        '{"queue" : "mail", "id" : 7, "count" : 2, "types" : ["t"]}',
        '{"queue" : "mail", "id" : 3, "count" : 2, "types" : null, "hops" : 1}',
    ]


async def test_the_workers_of_a_group_poll_in_turn_each_slot_once():
    """Each poll slot of `poll_interval` seconds (wall clock) belongs to one worker of those
    serving the same queues and types; a worker whose timer ends just before its slot begins
    does not poll in that slot twice."""
    group = []
    for w in ("a", "b", "c"):
        settings = pgworker.Settings(dsn="postgresql://localhost/x", worker_id=w, poll_interval=1)
        turns = Turns(settings, ["t"])
        turns._rows = [_peer(x, ["default"], ["t"]) for x in ("a", "b", "c")]
        turns._apply()
        group.append(turns)
    now = 3000.25
    owners = sorted(round(now + t.poll_delay(now)) for t in group)
    assert owners == [3001, 3002, 3003]
    alone = group[0]
    alone._rows = []
    alone._apply()
    assert alone.poll_delay(10.25) == 0.75
    alone.polled()
    assert alone.poll_delay(10.999) == pytest.approx(1.001)  # slot 11 is polled: next is 12
    alone.polled()
    assert alone.poll_delay(12.5) == 0.5
