"""Pausing a queue, with real `pgworker run` processes: a pause stops the
claims of its queue on every worker within a second of its commit (measured on the database's
clock, from `job_attempts.started_at`), the jobs running then finish as completed, enqueue still
works (the jobs wait as pending), the other queues go on; a resume wakes every worker of the
queue at once (well within their poll interval); each is a row of the operator log. Also through
PgBouncer in pooler mode, and in one process: the claim statement itself and its plan."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgworker
from pgworker import JobSpec
from pgworker._db import files
from pgworker._db.connection import create_pool
from pgworker._db.queries import queries

from .helpers import spawn_worker, wait_for
from .pgbouncer import PgBouncer, available

pytestmark = pytest.mark.asyncio(loop_scope="session")

WORKERS = 3
POLL = 60.0
"""The workers' poll interval: long, so that only a notification explains a prompt claim (the
three poll in turn, once per interval in all: a poll falls within SLACK of the resume one time
in 40)."""
WITHIN = 1.0
"""The promise: no claim of a paused queue later than this after the pause committed."""
SLACK = 1.5
"""For a loaded test machine, on the resume's wake-up (a missing one waits for a poll)."""


def stop(worker: subprocess.Popen[bytes]) -> int:
    worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=30)
    finally:
        worker.kill()


@contextlib.contextmanager
def fleet(dsn: str, tmp_path: Path, *args: str, n: int = WORKERS) -> Iterator[list[Path]]:
    """`n` real workers of tests.apps.pausing serving queues a and b; their logs. Their `hold`
    jobs of the file `release` in `tmp_path` end when the block does."""
    logs = [tmp_path / f"worker-{i}.log" for i in range(n)]
    workers = [
        spawn_worker(
            "tests.apps.pausing",
            dsn,
            log,
            "--queue",
            "a",
            "--queue",
            "b",
            "--worker-id",
            f"pause-{i}",
            *args,
        )
        for i, log in enumerate(logs)
    ]
    try:
        yield logs
    finally:
        (tmp_path / "release").touch()  # a `hold` job left running, when the test failed
        codes = [stop(w) for w in workers]
        assert codes == [0] * n, [log.read_text()[-2000:] for log in logs]


async def count(conn: Any, queue: str, status: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE queue = $1 AND status = $2", queue, status
    )


async def last_claim(conn: Any, queue: str) -> Any:
    return await conn.fetchval(
        "SELECT max(started_at) FROM pgworker.job_attempts WHERE queue = $1", queue
    )


async def test_a_pause_stops_every_worker_within_a_second_and_a_resume_wakes_them_all(
    dsn, conn, tmp_path
):
    with fleet(dsn, tmp_path, "--concurrency", "4", "--poll-interval", str(POLL)):
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) = 3 FROM pgworker.workers"), timeout=60
        )
        release = tmp_path / "release"
        long = (await pgworker.enqueue(conn, "hold", {"file": str(release)}, queue="a")).job.id
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'running' FROM pgworker.jobs WHERE id = $1", long
            ),
            timeout=30,
        )
        backlog = 1500
        await pgworker.enqueue_many(
            conn, [JobSpec("sleep", {"seconds": 0.05}, queue="a") for _ in range(backlog)]
        )
        # Claims flow on every worker before the pause.
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(DISTINCT worker_id) = 3 AND count(*) >= 60 "
                "FROM pgworker.job_attempts WHERE queue = 'a' AND outcome = 'completed'"
            ),
            timeout=60,
        )

        state = await pgworker.pause_queue(conn, "a", "mail provider down", by="tester")
        paused = await conn.fetchval("SELECT clock_timestamp()")  # after the pause committed
        assert state.paused and state.changed and state.known

        # Claims have stopped: the running jobs end, none starts, and the held one runs on (a
        # worker that kept claiming would keep several running until the backlog is done).
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) FILTER (WHERE status = 'running') <= 1 "
                "OR count(*) FILTER (WHERE status = 'pending') = 0 "
                "FROM pgworker.jobs WHERE queue = 'a'"
            ),
            timeout=30,
        )
        late = await conn.fetchval(
            "SELECT extract(epoch FROM max(started_at) - $1::timestamptz)::float8 "
            "FROM pgworker.job_attempts WHERE queue = 'a'",
            paused,
        )
        assert late <= WITHIN, f"a job of the paused queue was claimed {late:.3f}s after it"
        waiting = await count(conn, "a", "pending")
        assert waiting > 0, "the backlog was done before the pause: nothing was proven"
        assert await count(conn, "a", "running") == 1

        # Enqueue still works; other queues go on meanwhile.
        held = (await pgworker.enqueue(conn, "echo", {"n": 1}, queue="a")).job.id
        others = await pgworker.enqueue_many(
            conn, [JobSpec("echo", {"n": n}, queue="b") for n in range(30)]
        )
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 30 FROM pgworker.jobs WHERE queue = 'b' AND status = 'completed'"
            ),
            timeout=30,
        )
        assert len(others) == 30
        assert await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", held) == (
            "pending"
        )
        assert await count(conn, "a", "pending") == waiting + 1

        # The job running through the pause finishes, once, not interrupted.
        release.touch()
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", long
            ),
            timeout=30,
        )
        outcomes = await conn.fetch(
            "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1", long
        )
        assert [r["outcome"] for r in outcomes] == ["completed"]
        assert await last_claim(conn, "a") <= paused
        assert await count(conn, "a", "pending") == waiting + 1

        resumed_state = await pgworker.resume_queue(conn, "a", by="tester")
        resumed = await conn.fetchval("SELECT clock_timestamp()")
        assert resumed_state.changed and not resumed_state.paused
        # Every worker claims the backlog at once: a notification, not a poll.
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(DISTINCT worker_id) = 3 FROM pgworker.job_attempts "
                "WHERE queue = 'a' AND started_at > $1",
                resumed,
            ),
            timeout=10 * SLACK,
        )
        firsts = await conn.fetch(
            "SELECT worker_id, extract(epoch FROM min(started_at) - $1::timestamptz)::float8 AS s "
            "FROM pgworker.job_attempts WHERE queue = 'a' AND started_at > $1 GROUP BY worker_id",
            resumed,
        )
        assert max(r["s"] for r in firsts) < SLACK, [dict(r) for r in firsts]
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 0 FROM pgworker.jobs WHERE status IN ('pending', 'running')"
            ),
            timeout=180,
            every=0.2,
        )
    # Every job ran once, to completion: none was interrupted or lost by the pause.
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.job_attempts WHERE outcome <> 'completed'"
        )
        == 0
    )
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == backlog + 32
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts") == backlog + 32
    log = await conn.fetch(
        "SELECT actor, action, queue, reason, detail FROM pgworker.operator_log ORDER BY id"
    )
    assert [(r["actor"], r["action"], r["queue"], r["reason"]) for r in log] == [
        ("tester", "pause", "a", "mail provider down"),
        ("tester", "resume", "a", None),
    ]
    ended = json.loads(log[1]["detail"])
    assert (ended["paused_by"], ended["pause_reason"]) == ("tester", "mail provider down")


# --- the claim itself, in one process --------------------------------------------------------

PREPARE = (
    "PREPARE claim(text[], text[], int, text, float8, int[], text, text, text[], int[], boolean, "
    "int[]) AS "
)


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += nodes(child)
    return found


async def claim_plan(c: Any, queues: list[str]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the claim prepared as `claim` (of type t in `queues`), rolled back."""
    tr = c.transaction()
    await tr.start()
    try:
        raw = await c.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim('{{{','.join(queues)}}}', '{{t}}', "
            "10, 'w', 30, '{3}', NULL, 'off', '{t}', '{1}', false, NULL)"
        )
    finally:
        await tr.rollback()
    return json.loads(raw)[0]["Plan"]


async def test_the_claim_probes_the_controls_once_per_queue_and_reads_jobs_as_before(dsn, conn):
    """The claim of a worker's generic plan (as a worker's pool runs it): one probe of the
    queues' primary key per queue served, whatever the controls table holds, and the jobs read
    by one index scan per (queue, type, version), none of a paused queue."""
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, queue) SELECT 't', q FROM unnest($1::text[]) AS q, "
        "generate_series(1, 50)",
        ["a", "b", "c"],
    )
    await conn.execute(
        "INSERT INTO pgworker.queues (name) SELECT 'other-' || g FROM generate_series(1, 5000) g"
    )
    await conn.execute("VACUUM ANALYZE pgworker.jobs")
    await conn.execute("VACUUM ANALYZE pgworker.queues")
    pool = await create_pool(dsn, size=1, keyed=True)
    try:
        async with pool.acquire() as c:
            await c.execute(PREPARE + files.queries("pgworker")["job_claim"])
            for paused in ([], ["b"]):
                for queue in paused:
                    await pgworker.pause_queue(conn, queue)
                plan = nodes(await claim_plan(c, ["a", "b", "c"]))
                probes = [n for n in plan if n.get("Relation Name") == "queues"]
                assert [(n["Node Type"], n["Index Name"], n["Actual Loops"]) for n in probes] == [
                    ("Index Scan", "queues_pkey", 3)
                ], probes
                claims = [
                    n
                    for n in plan
                    if n.get("Index Name") == "jobs_claim_type_idx" and n["Actual Loops"] > 0
                ]
                assert len(claims) == 1 and claims[0]["Actual Loops"] == 3 - len(paused), claims
    finally:
        await pool.close()


async def test_a_claim_takes_nothing_of_a_paused_queue_and_everything_else(pool):
    await pgworker.enqueue_many(
        pool, [JobSpec("t", {"n": n}, queue=q) for q in ("a", "b") for n in range(5)]
    )
    await pgworker.pause_queue(pool, "a")
    q = queries("pgworker")
    claimed = await q.job_claim(
        pool,
        queues=["a", "b"],
        types=["t"],
        default_max_retries=[3],
        limit=100,
        worker_id="w",
        lease=30,
        code_version=None,
    )
    assert sorted(r["queue"] for r in claimed) == ["b"] * 5
    await pgworker.resume_queue(pool, "a")
    claimed = await q.job_claim(
        pool,
        queues=["a", "b"],
        types=["t"],
        default_max_retries=[3],
        limit=100,
        worker_id="w",
        lease=30,
        code_version=None,
    )
    assert sorted(r["queue"] for r in claimed) == ["a"] * 5


async def test_drain_runs_past_a_paused_queues_jobs(conn):
    """pgworker.testing's drain claims as a worker does: a paused queue's jobs stay pending,
    and a job of another queue due after one of them still runs within `until` (a paused job
    due first must not end the drain)."""
    registry = pgworker.Registry()
    ran: list[str] = []

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        ran.append(payload["q"])

    from pgworker.testing import drain

    await pgworker.enqueue(conn, "t", {"q": "a"}, queue="a", delay=100)
    await pgworker.enqueue(conn, "t", {"q": "b"}, queue="b", delay=200)
    await pgworker.pause_queue(conn, "a")
    await drain(conn, registry, queues=["a", "b"], until=300)
    assert ran == ["b"]
    assert await count(conn, "a", "pending") == 1


# --- pooler mode ---------------------------------------------------------------------------------


@pytest.mark.skipif(not available(), reason="needs PgBouncer (/usr/sbin/pgbouncer)")
async def test_a_pooler_worker_obeys_a_pause_and_a_resume(dsn, conn, server_dsn, tmp_path):
    """Through PgBouncer in transaction mode, polling (no LISTEN): the pause holds from the
    next claim; the resume is found at the next poll."""
    await pgworker.enqueue_many(
        conn, [JobSpec("sleep", {"seconds": 0.05}, queue="a") for _ in range(400)]
    )
    with PgBouncer(server_dsn, pool_size=4) as bouncer:
        log = tmp_path / "worker.log"
        worker = spawn_worker(
            "tests.apps.basic",
            bouncer.dsn(dsn),
            log,
            "--pooler",
            "--queue",
            "a",
            "--concurrency",
            "4",
            "--poll-interval",
            "0.2",
        )
        try:
            await wait_for(lambda: count(conn, "a", "completed"), timeout=60)
            await pgworker.pause_queue(conn, "a")
            paused = await conn.fetchval("SELECT clock_timestamp()")
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 0 FROM pgworker.jobs WHERE status = 'running'"
                ),
                timeout=30,
            )
            assert await last_claim(conn, "a") <= paused
            assert await count(conn, "a", "pending") > 0, "done before the pause: nothing proven"
            await pgworker.resume_queue(conn, "a")
            await wait_for(
                lambda: conn.fetchval(
                    "SELECT count(*) = 0 FROM pgworker.jobs WHERE status <> 'completed'"
                ),
                timeout=120,
                every=0.2,
            )
            assert worker.poll() is None, log.read_text()[-3000:]
        finally:
            assert stop(worker) == 0, log.read_text()[-3000:]
