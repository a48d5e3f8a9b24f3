"""Retention: the elected worker deletes finished jobs past their age, in
batches, with everything recorded about them, fenced by its leadership, while claims go on;
`pgworker prune` and `pgworker.prune` do the same by hand; the settings and options that say how
long jobs are kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from structlog.testing import capture_logs

import pgworker
from pgworker._db.queries import queries
from pgworker._maintenance import retention as _retention
from pgworker._maintenance.leader import interval
from pgworker._maintenance.maintenance import Maintenance

from .helpers import cli, has_status, logged, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

DAY = 86400.0


async def finished(
    conn, n: int, status: str, days_ago: float, type_: str = "old", records: bool = False
) -> list[int]:
    """`n` jobs that finished with `status` `days_ago` days ago; with `records`, each with an
    attempt, a step, a milestone and an event."""
    ids = await conn.fetchval(
        """WITH made AS (
               INSERT INTO pgworker.jobs (type, status, attempts, finished_at, idempotency_key)
               SELECT $2, $3, 1, now() - make_interval(secs => $4 * 86400 + g), NULL
               FROM generate_series(1, $1) AS g
               RETURNING id)
           SELECT array_agg(id ORDER BY id) FROM made""",
        n,
        type_,
        status,
        days_ago,
    )
    if records:
        for sql in (
            """INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
                   correlation_id, outcome, finished_at)
               SELECT id, 1, type, queue, 'w', correlation_id, 'failed', finished_at
               FROM pgworker.jobs WHERE id = ANY($1)""",
            """INSERT INTO pgworker.job_steps (job_id, name, result, attempt, started_at)
               SELECT id, 's', '1', 1, now() FROM unnest($1::bigint[]) AS id""",
            """INSERT INTO pgworker.job_milestones (job_id, attempt, milestone)
               SELECT id, 1, 'm' FROM unnest($1::bigint[]) AS id""",
            """INSERT INTO pgworker.job_events (job_id, kind, actor)
               SELECT id, 'replayed', 'a' FROM unnest($1::bigint[]) AS id""",
        ):
            await conn.execute(sql, ids)
    return list(ids)


async def remaining(conn, ids: list[int]) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE id = ANY($1)", ids)


async def records_of(conn, ids: list[int]) -> dict[str, int]:
    return {
        table: await conn.fetchval(
            f"SELECT count(*) FROM pgworker.{table} WHERE job_id = ANY($1)", ids
        )
        for table in ("job_attempts", "job_steps", "job_milestones", "job_events")
    }


# --- by hand -------------------------------------------------------------------------------------


async def test_prune_deletes_old_finished_jobs_with_their_records_and_keeps_the_rest(conn):
    old = {
        s: await finished(conn, 3, s, days_ago=10, records=True)
        for s in ("completed", "failed", "cancelled")
    }
    recent = await finished(conn, 3, "completed", days_ago=1, records=True)
    pending = (await pgworker.enqueue(conn, "p", {})).job.id
    await conn.execute(
        "UPDATE pgworker.jobs SET created_at = now() - interval '20 days' WHERE id = $1", pending
    )
    everything_old = [i for ids in old.values() for i in ids]

    dry = await pgworker.prune(conn, older_than="7d", dry_run=True)
    assert dry == {"completed": 3, "failed": 3, "cancelled": 3}
    assert await remaining(conn, everything_old) == 9

    only_failed = await pgworker.prune(conn, older_than=timedelta(days=7), statuses=["failed"])
    assert only_failed == {"failed": 3}
    assert await remaining(conn, old["failed"]) == 0
    assert await remaining(conn, old["completed"] + old["cancelled"]) == 6

    assert await pgworker.prune(conn, older_than=7 * DAY) == {
        "completed": 3,
        "failed": 0,
        "cancelled": 3,
    }
    assert await remaining(conn, everything_old) == 0
    assert await records_of(conn, everything_old) == dict.fromkeys(
        ("job_attempts", "job_steps", "job_milestones", "job_events"), 0
    )
    assert await remaining(conn, recent) == 3
    assert await records_of(conn, recent) == dict.fromkeys(
        ("job_attempts", "job_steps", "job_milestones", "job_events"), 3
    )
    assert await has_status(conn, pending, "pending")


async def test_a_pruned_jobs_idempotency_key_is_free_again(conn):
    first = await pgworker.enqueue(conn, "charge", {"order": 42}, idempotency_key="order-42")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() - interval '8 days' "
        "WHERE id = $1",
        first.job.id,
    )
    again = await pgworker.enqueue(conn, "charge", {"order": 42}, idempotency_key="order-42")
    assert not again.created and again.job.id == first.job.id
    assert await pgworker.prune(conn, older_than="7d") == {
        "completed": 1,
        "failed": 0,
        "cancelled": 0,
    }
    fresh = await pgworker.enqueue(conn, "charge", {"order": 42}, idempotency_key="order-42")
    assert fresh.created and fresh.job.id != first.job.id


async def test_each_statement_deletes_one_batch_oldest_first(conn):
    ids = await finished(conn, 2500, "completed", days_ago=10)
    q = queries("pgworker")
    ages = {"completed": 7 * DAY}
    assert await q.jobs_prune(conn, ages, 1000) == {"completed": 1000}
    # the oldest went first: ids were made youngest last (finished_at = 10 days + g seconds ago)
    left = await conn.fetch("SELECT id FROM pgworker.jobs WHERE id = ANY($1) ORDER BY id", ids)
    assert [r["id"] for r in left] == ids[:1500]
    assert await pgworker.prune(conn, older_than="7d") == {
        "completed": 1500,
        "failed": 0,
        "cancelled": 0,
    }
    # fenced by the leadership: a worker that does not lead deletes nothing
    more = await finished(conn, 5, "completed", days_ago=10)
    assert await q.jobs_prune(conn, ages, 1000, "not-the-leader") == {}
    assert await remaining(conn, more) == 5


async def test_the_prune_command_counts_deletes_and_refuses_bad_input(dsn, conn):
    old = await finished(conn, 4, "completed", days_ago=3)
    failed = await finished(conn, 2, "failed", days_ago=3)
    dry = cli("prune", "--older-than", "2d", "--dry-run", "--dsn", dsn)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == "would prune 6 jobs (completed 4, failed 2, cancelled 0)"
    for bad in (["--older-than", "soon"], ["--older-than", "0"], ["--older-than=-1d"]):
        out = cli("prune", *bad, "--dsn", dsn)
        assert out.returncode == 2, out.stderr
        [line] = out.stderr.strip().splitlines()
        assert line.startswith("pgworker prune: error: --older-than: "), line
    out = cli("prune", "--older-than", "2d", "--status", "pending", "--dsn", dsn)
    assert out.returncode == 2 and "--status" in out.stderr
    assert await remaining(conn, old + failed) == 6
    done = cli("prune", "--older-than", "2d", "--status", "completed", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pruned 4 jobs (completed 4)"
    assert await remaining(conn, old) == 0 and await remaining(conn, failed) == 2


async def test_prune_refuses_bad_input_naming_the_field(conn):
    ids = await finished(conn, 2, "completed", days_ago=10)
    for kwargs, field in [
        (dict(older_than="soon"), "older_than"),
        (dict(older_than=0), "older_than"),
        (dict(older_than=float("nan")), "older_than"),
        (dict(older_than="7d", statuses=["pending"]), "statuses"),
        (dict(older_than="7d", statuses="completed"), "statuses"),
        (dict(older_than="7d", statuses=[]), "statuses"),
        (dict(older_than="7d", dry_run=1), "dry_run"),
    ]:
        with pytest.raises(pgworker.ValidationError) as raised:
            await pgworker.prune(conn, **kwargs)
        assert raised.value.field == field, kwargs
    assert await remaining(conn, ids) == 2


# --- the elected worker --------------------------------------------------------------------------


async def test_the_leader_prunes_in_batches_per_round_each_status_after_its_own_age(
    dsn, pool, monkeypatch
):
    """A round deletes a few batches; a backlog brings the next round after half a lease, none
    after RETENTION_EVERY."""
    monkeypatch.setattr(_retention, "RETENTION_BATCHES", 2)
    monkeypatch.setattr(_retention, "RETENTION_BATCH", 1000)
    completed = await finished(pool, 2500, "completed", days_ago=2, records=True)
    failed_young = await finished(pool, 3, "failed", days_ago=2)
    failed_old = await finished(pool, 3, "cancelled", days_ago=40)
    settings = pgworker.Settings(dsn=dsn, worker_id="leader", retain_completed=DAY)
    with capture_logs() as logs:
        leader = Maintenance(pool, settings)  # its logger is made here
        assert leader.retention is not None and await leader.leadership.renew()
        # The first round: two batches, the oldest 2,000 jobs; a backlog: the next one soon.
        assert await leader.retention.step() == interval(settings.lease)
        assert await remaining(pool, completed + failed_old) == 503
        # The backlog drained: the next round after RETENTION_EVERY.
        assert await leader.retention.step() == _retention.RETENTION_EVERY
    assert await remaining(pool, completed + failed_old) == 0
    assert await records_of(pool, completed) == dict.fromkeys(
        ("job_attempts", "job_steps", "job_milestones", "job_events"), 0
    )
    assert await remaining(pool, failed_young) == 3  # failed jobs are kept 30 days
    lines = logged(logs, "pruned finished jobs past their retention")
    assert [(line.get("completed"), line.get("cancelled"), line["backlog"]) for line in lines] == [
        (1997, 3, True),
        (503, None, False),
    ]


async def test_a_worker_that_does_not_lead_prunes_nothing_and_none_keeps_forever(dsn, pool):
    old = await finished(pool, 3, "completed", days_ago=10)
    failed = await finished(pool, 3, "failed", days_ago=40)
    await pool.execute(
        "INSERT INTO pgworker.leader (name, worker_id, expires_at) "
        "VALUES ('maintenance', 'someone-else', now() + interval '1 hour')"
    )
    follower = Maintenance(pool, pgworker.Settings(dsn=dsn, worker_id="follower"))
    await follower.tick()
    assert not follower.leading and await remaining(pool, old + failed) == 6
    await pool.execute("DELETE FROM pgworker.leader")
    keeper = Maintenance(
        pool, pgworker.Settings(dsn=dsn, worker_id="keeper", retain_completed=None)
    )
    await keeper.tick()
    assert keeper.leading
    assert await remaining(pool, old) == 3 and await remaining(pool, failed) == 0


async def test_a_worker_prunes_5000_old_jobs_in_batches_while_it_completes_new_ones(
    dsn, pool, monkeypatch
):
    """The acceptance: one batch per round (a round each second with a 2 s lease while a
    backlog remains), while the same worker claims and completes jobs enqueued meanwhile;
    recent and pending jobs are kept."""
    monkeypatch.setattr(_retention, "RETENTION_BATCHES", 1)
    monkeypatch.setattr(_retention, "RETENTION_BATCH", 1000)
    old = await finished(pool, 5000, "completed", days_ago=10, records=True)
    recent = await finished(pool, 10, "completed", days_ago=1)
    unserved = (await pgworker.enqueue(pool, "nobody-serves", {})).job.id
    registry = pgworker.Registry()

    @registry.task("plain")
    async def plain(ctx: pgworker.JobContext, payload: dict) -> None:
        return None

    with capture_logs() as logs:
        async with serving_guarded(registry, dsn, lease=2.0, retain_completed=7 * DAY):
            await wait_for(lambda: _fewer(pool, old, 5000), timeout=30)
            during = [(await pgworker.enqueue(pool, "plain", {"n": n})).job.id for n in range(20)]
            await wait_for(lambda: _all_completed(pool, during), timeout=30)
            assert await remaining(pool, old) > 0, "the prune ended before the jobs completed"
            await wait_for(lambda: _fewer(pool, old, 1), timeout=60)
    assert await remaining(pool, recent) == 10
    assert await has_status(pool, unserved, "pending")
    assert await _all_completed(pool, during)
    assert await records_of(pool, old) == dict.fromkeys(
        ("job_attempts", "job_steps", "job_milestones", "job_events"), 0
    )
    lines = logged(logs, "pruned finished jobs past their retention")
    assert [line["completed"] for line in lines] == [1000] * 5


async def _fewer(pool, ids: list[int], than: int) -> bool:
    return await remaining(pool, ids) < than


async def _all_completed(pool, ids: list[int]) -> bool:
    return await pool.fetchval(
        "SELECT count(*) = $2 FROM pgworker.jobs WHERE id = ANY($1) AND status = 'completed'",
        ids,
        len(ids),
    )


# --- how long jobs are kept ---------------------------------------------------------------------


async def test_retention_settings_default_validate_and_read_their_variables(dsn):
    s = pgworker.Settings(dsn="postgresql://x")
    assert (s.retain_completed, s.retain_failed) == (7 * DAY, 30 * DAY)
    s = pgworker.Settings(dsn="x", retain_completed=0, retain_failed=timedelta(hours=2))
    assert (s.retain_completed, s.retain_failed) == (None, 7200.0)
    for bad in (-1, float("nan"), "a week", True):
        with pytest.raises(pgworker.ConfigError) as raised:
            pgworker.Settings(dsn="x", retain_failed=bad)
        assert raised.value.field == "retain_failed"
    env = {"PGWORKER_DSN": "x", "PGWORKER_RETAIN_COMPLETED": "none", "PGWORKER_RETAIN_FAILED": "2h"}
    s = pgworker.Settings.from_env(env)
    assert (s.retain_completed, s.retain_failed) == (None, 7200.0)
    assert pgworker.Settings.from_env({**env, "PGWORKER_RETAIN_FAILED": "0"}).retain_failed is None
    with pytest.raises(pgworker.ConfigError) as raised:
        pgworker.Settings.from_env({**env, "PGWORKER_RETAIN_COMPLETED": "a week"})
    assert raised.value.field == "PGWORKER_RETAIN_COMPLETED"
    out = cli("run", "tests.apps.basic", "--retain-completed", "a week", "--dsn", dsn)
    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "--retain-completed" in line and "a week" in line, line


# --- prune's statuses ------------------------------------------------------------------------


@pytest.mark.parametrize("statuses", [[["failed"]], [{"failed": 1}]])
async def test_prune_with_statuses_that_are_not_names_is_a_validation_error(conn, statuses):
    """A list inside the list raised TypeError (unhashable) from a public function."""
    with pytest.raises(pgworker.ValidationError) as caught:
        await pgworker.prune(conn, older_than=3600, statuses=statuses)
    assert caught.value.field == "statuses"
