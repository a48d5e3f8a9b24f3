"""Dependencies and fan-in, with real workers: a job enqueued with after= runs
only once every parent has ended (its attempt starts after the last parent's finished_at), reads
their results through ctx.parents, is cancelled by a failed parent (or runs, with "run"), runs at
once when its parents already ended; bad input is refused with nothing written; many parents
ending at once in parallel slots never leave a dependant parked; the replay rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgworker
from pgworker import JobSpec, ValidationError
from pgworker.operations import show_job

from .helpers import has_status, serving_guarded, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


def make_registry(seen: dict[int, dict[int, Any]] | None = None) -> pgworker.Registry:
    registry = pgworker.Registry()

    @registry.task("square", max_retries=0)
    async def square(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
        return int(payload["n"]) ** 2

    @registry.task("boom", max_retries=0)
    async def boom(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        raise RuntimeError("boom")

    @registry.task("total", max_retries=0)
    async def total(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
        parents = ctx.parents
        if seen is not None:
            seen[ctx.job_id] = {i: (p.status, p.result) for i, p in parents.items()}
        return sum(p.result or 0 for p in parents.values())

    @registry.task("total_sync", max_retries=0)
    def total_sync(ctx: pgworker.JobContext, payload: dict[str, Any]) -> int:
        return len(ctx.parents)

    return registry


async def job(conn: asyncpg.Connection, job_id: int) -> pgworker.Job:
    found = await pgworker.get_job(conn, job_id)
    assert found is not None
    return found


async def ended(conn: asyncpg.Connection, job_id: int) -> bool:
    return (await job(conn, job_id)).status in ("completed", "failed", "cancelled")


async def test_fan_in_starts_after_the_last_child_and_reads_every_result(
    dsn: str, conn: asyncpg.Connection
) -> None:
    seen: dict[int, dict[int, Any]] = {}
    children = await pgworker.enqueue_many(conn, [JobSpec("square", {"n": n}) for n in range(20)])
    ids = [r.job.id for r in children]
    total = await pgworker.enqueue(conn, "total", after=ids)
    assert total.job.parents == tuple(ids) and total.job.parents_left == 20
    parked = await job(conn, total.job.id)
    assert parked.status == "pending" and parked.parents_left == 20
    async with serving_guarded(make_registry(seen), dsn, concurrency=8):
        await wait_for(lambda: ended(conn, total.job.id), timeout=30)
    done = await job(conn, total.job.id)
    assert done.status == "completed", done.error
    assert done.result == sum(n * n for n in range(20))
    assert len(seen[total.job.id]) == 20
    last_child = await conn.fetchval(
        "SELECT max(finished_at) FROM pgworker.job_attempts WHERE job_id = ANY($1)", ids
    )
    started = await conn.fetchval(
        "SELECT started_at FROM pgworker.job_attempts WHERE job_id = $1", total.job.id
    )
    assert started >= last_child


async def test_a_failed_parent_cancels_a_dependant_naming_it(
    dsn: str, conn: asyncpg.Connection
) -> None:
    ok = await pgworker.enqueue(conn, "square", {"n": 2})
    bad = await pgworker.enqueue(conn, "boom")
    cancelled = await pgworker.enqueue(conn, "total", after=[ok.job.id, bad.job.id])
    grandchild = await pgworker.enqueue(conn, "total", after=[cancelled.job.id])
    runs = await pgworker.enqueue(
        conn, "total", after=[ok.job.id, bad.job.id], on_parent_failure="run"
    )
    async with serving_guarded(make_registry(), dsn):
        await wait_for(lambda: ended(conn, runs.job.id), timeout=30)
        await wait_for(lambda: ended(conn, grandchild.job.id), timeout=30)
    c = await job(conn, cancelled.job.id)
    assert c.status == "cancelled"
    assert c.error == f"ParentFailed: parent {bad.job.id} failed"
    assert (
        await conn.fetchval("SELECT count(*) FROM pgworker.job_attempts WHERE job_id = $1", c.id)
        == 0
    )
    g = await job(conn, grandchild.job.id)
    assert g.status == "cancelled" and g.error == f"ParentFailed: parent {c.id} cancelled"
    r = await job(conn, runs.job.id)
    assert r.status == "completed" and r.result == 4


async def test_parents_already_ended_run_at_once(dsn: str, conn: asyncpg.Connection) -> None:
    parent = await pgworker.enqueue(conn, "square", {"n": 3})
    async with serving_guarded(make_registry(), dsn):
        await wait_for(lambda: ended(conn, parent.job.id), timeout=30)
        child = await pgworker.enqueue(conn, "total_sync", after=[parent.job.id])
        assert child.job.parents_left == 0
        await wait_for(lambda: ended(conn, child.job.id), timeout=30)
    done = await job(conn, child.job.id)
    assert done.status == "completed" and done.result == 1
    failed = await pgworker.enqueue(conn, "boom")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        failed.job.id,
    )
    late = await pgworker.enqueue(conn, "total", after=[failed.job.id])
    assert late.job.status == "cancelled"
    assert late.job.error == f"ParentFailed: parent {failed.job.id} failed"


async def jobs_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM pgworker.jobs"))


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"after": [999_999]}, "after", "999999"),
        ({"after": [1, 1]}, "after", "more than once"),
        ({"after": list(range(1, 1002))}, "after", "at most 1,000"),
        ({"after": "1"}, "after", "list of job ids"),
        ({"after": [0]}, "after", "whole numbers from 1"),
        ({"after": [False]}, "after", "whole numbers from 1"),
        ({"after": [1], "on_parent_failure": "ignore"}, "on_parent_failure", '"cancel" or "run"'),
        ({"on_parent_failure": "run"}, "on_parent_failure", "give after="),
        ({"after": [1], "delay": 5}, "delay", "not both"),
        ({"after": [1], "run_at": "2030-01-01T00:00:00+00:00"}, "run_at", "not both"),
    ],
)
async def test_bad_input_is_refused_with_nothing_written(
    conn: asyncpg.Connection, options: dict[str, Any], field: str, words: str
) -> None:
    first = await pgworker.enqueue(conn, "square", {"n": 1})
    options = {
        k: ([first.job.id if i == 1 else i for i in v] if k == "after" and v != "1" else v)
        for k, v in options.items()
    }
    if options.get("run_at"):
        from datetime import datetime

        options["run_at"] = datetime.fromisoformat(options["run_at"])
    before = await jobs_count(conn)
    with pytest.raises(ValidationError) as raised:
        await pgworker.enqueue(conn, "total", **options)
    assert raised.value.field == field and words in str(raised.value)
    with pytest.raises(ValidationError) as raised:
        await pgworker.enqueue_many(conn, [JobSpec("square"), JobSpec("total", **options)])
    assert raised.value.field == f"specs[1].{field}"
    assert await jobs_count(conn) == before
    assert not await conn.fetchval("SELECT has_dependants FROM pgworker.jobs WHERE id = $1", 1)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.job_dependencies") == 0


async def test_unknown_ids_are_refused_by_name_with_nothing_written(
    conn: asyncpg.Connection,
) -> None:
    known = await pgworker.enqueue(conn, "square", {"n": 1})
    before = await jobs_count(conn)
    with pytest.raises(ValidationError, match=r"^after: no job has the id 424242, 424243:"):
        await pgworker.enqueue(conn, "total", after=[424243, known.job.id, 424242])
    assert await jobs_count(conn) == before
    assert not (
        await conn.fetchval("SELECT has_dependants FROM pgworker.jobs WHERE id = $1", known.job.id)
    )


async def test_a_job_cannot_run_after_itself(conn: asyncpg.Connection) -> None:
    parent = await pgworker.enqueue(conn, "square", {"n": 1})
    first = await pgworker.enqueue(conn, "total", after=[parent.job.id], idempotency_key="k")
    before = await jobs_count(conn)
    with pytest.raises(ValidationError, match="cannot run after itself") as raised:
        await pgworker.enqueue(
            conn, "total", after=[parent.job.id, first.job.id], idempotency_key="k"
        )
    assert raised.value.field == "after"
    assert await jobs_count(conn) == before
    assert not await conn.fetchval(
        "SELECT has_dependants FROM pgworker.jobs WHERE id = $1", first.job.id
    )


async def test_many_parents_ending_at_once_never_leave_a_dependant_parked(
    dsn: str, conn: asyncpg.Connection
) -> None:
    """Rounds of 24 parents held running by 3 workers of 8 slots each, then let go at once: their
    outcomes are written by three completers whose transactions overlap, and dependants after
    pairs, fours and all of them must all run (a recount of the parents not ended, instead of
    the counter, leaves some parked: each transaction sees the other's parent still running).
    Dependants are also enqueued while the parents end (each locks its parents)."""
    registry = make_registry()
    gate = anyio.Event()

    @registry.task("held", max_retries=0)
    async def held(ctx: pgworker.JobContext, payload: Any) -> int:
        await gate.wait()
        return 1

    async with (
        serving_guarded(registry, dsn, concurrency=8),
        serving_guarded(registry, dsn, concurrency=8),
        serving_guarded(registry, dsn, concurrency=8),
    ):
        for _ in range(4):
            gate = anyio.Event()
            parents = await pgworker.enqueue_many(conn, [JobSpec("held") for _ in range(24)])
            ids = [r.job.id for r in parents]
            groups = [ids[k : k + 2] for k in range(0, 24, 2)]
            groups += [ids[k : k + 4] for k in range(0, 24, 4)] + [ids]
            kids = [(await pgworker.enqueue(conn, "total", after=g)).job.id for g in groups]

            async def all_running(ids: list[int] = ids) -> bool:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) = 24 FROM pgworker.jobs"
                        " WHERE id = ANY($1) AND status = 'running'",
                        ids,
                    )
                )

            await wait_for(all_running, timeout=30)
            gate.set()
            for k in range(6):  # enqueued while the parents end
                kids.append((await pgworker.enqueue(conn, "total", after=ids[k::6])).job.id)

            async def all_ran(kids: list[int] = kids) -> bool:
                return bool(
                    await conn.fetchval(
                        "SELECT count(*) = $2 FROM pgworker.jobs"
                        " WHERE id = ANY($1) AND status = 'completed'",
                        kids,
                        len(kids),
                    )
                )

            await wait_for(all_ran, timeout=30)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE run_at = 'infinity' OR parents_left <> 0"
        )
        == 0
    )


async def test_the_replay_rule(dsn: str, conn: asyncpg.Connection) -> None:
    """Replaying a parent parks its dependants that have not started again; those that ran are
    left alone; those it cancelled stay cancelled, and replayed themselves wait for their
    parents' current statuses."""
    bad = await pgworker.enqueue(conn, "boom")
    waiting = await pgworker.enqueue(conn, "total", after=[bad.job.id], on_parent_failure="run")
    cancelled = await pgworker.enqueue(conn, "total", after=[bad.job.id])
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        bad.job.id,
    )
    released = await job(conn, waiting.job.id)
    assert released.parents_left == 0 and released.run_at.year < 9999
    assert (await job(conn, cancelled.job.id)).status == "cancelled"
    # Replayed, the parent makes the dependant that has not run wait again.
    await pgworker.replay(conn, [bad.job.id])
    again = await job(conn, waiting.job.id)
    assert again.status == "pending" and again.parents_left == 1
    assert await conn.fetchval(
        "SELECT run_at = 'infinity' FROM pgworker.jobs WHERE id = $1", waiting.job.id
    )
    assert (await job(conn, cancelled.job.id)).status == "cancelled"
    # The cancelled dependant, replayed while its parent is pending again: it waits for it.
    await pgworker.replay(conn, [cancelled.job.id])
    c = await job(conn, cancelled.job.id)
    assert c.status == "pending" and c.parents_left == 1
    # A dependant that already ran is left alone by a later replay of its parent.
    async with serving_guarded(make_registry(), dsn):
        await wait_for(lambda: ended(conn, waiting.job.id), timeout=30)
        await wait_for(lambda: ended(conn, cancelled.job.id), timeout=30)
        assert (await job(conn, bad.job.id)).status == "failed"
        await pgworker.replay(conn, [bad.job.id])
        await wait_for(lambda: ended(conn, bad.job.id), timeout=30)
    ran = await job(conn, waiting.job.id)
    assert ran.status == "completed" and ran.attempts == 1
    assert (await job(conn, cancelled.job.id)).status == "cancelled"  # cancelled again


async def test_a_plain_job_costs_no_parents_query(dsn: str, conn: asyncpg.Connection) -> None:
    """ctx.parents of a job without parents is {} and reads nothing."""
    registry = pgworker.Registry()
    got: list[Any] = []

    @registry.task("plain")
    def plain(ctx: pgworker.JobContext, payload: Any) -> None:
        got.append(ctx.parents)

    r = await pgworker.enqueue(conn, "plain")
    assert r.job.parents is None and r.job.parents_left is None
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: ended(conn, r.job.id), timeout=30)
    assert got == [{}]
    with anyio.fail_after(1):
        assert (await job(conn, r.job.id)).status == "completed"


async def test_show_cli_http_and_dashboard_list_parents_and_what_the_job_waits_for(
    dsn: str, conn: asyncpg.Connection
) -> None:
    import json
    import re

    import httpx

    from .helpers import cli
    from .webserver import serving

    done = await pgworker.enqueue(conn, "square", {"n": 1})
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', finished_at = now() WHERE id = $1",
        done.job.id,
    )
    waiting = await pgworker.enqueue(conn, "square", {"n": 2})
    # The CLI: --after repeatable, --on-parent-failure.
    answer = cli(
        "enqueue", "total", "--dsn", dsn, "--after", str(done.job.id),
        "--after", str(waiting.job.id), "--on-parent-failure", "run",
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr
    child_id = json.loads(answer.stdout)["id"]
    child = await job(conn, child_id)
    assert child.parents == (done.job.id, waiting.job.id) and child.parents_left == 1
    refused = cli("enqueue", "total", "--dsn", dsn, "--after", "987654")
    assert refused.returncode != 0 and "after: no job has the id 987654" in refused.stderr
    shown = cli("show", str(child_id), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    assert "parents: 2, waits for 1" in shown.stdout
    assert f"{waiting.job.id}  pending  (waited for)" in shown.stdout
    as_json = json.loads(cli("show", str(child_id), "--dsn", dsn, "--json").stdout)
    assert as_json["waits_for"] == [waiting.job.id]
    assert as_json["job"]["parents"] == [done.job.id, waiting.job.id]
    async with serving(dsn) as served:
        async with served.client() as c:
            body = {"type": "total", "payload": {}, "after": [waiting.job.id]}
            r = await c.post("/jobs", json=body)
            assert r.status_code == 201, r.text
            assert r.json()["parents"] == [waiting.job.id] and r.json()["parents_left"] == 1
            r = await c.post("/jobs", json={**body, "after": [555555]})
            assert r.status_code == 404 and r.json()["field"] == "after", r.text
            assert "no job has the id 555555" in r.json()["error"]
            r = await c.post("/jobs", json={**body, "after": [waiting.job.id] * 2})
            assert r.status_code == 422 and r.json()["field"] == "after", r.text
            r = await c.post("/jobs", json={**body, "delay": 5})
            assert r.status_code == 422, r.text
            assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 4
            r = await c.post("/jobs", json={**body, "on_parent_failure": "skip"})
            assert r.status_code == 422, r.text
            r = await c.get(f"/jobs/{child_id}")
            assert r.json()["parents"] == [done.job.id, waiting.job.id], r.text
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as ui:
            form = await ui.get("/ui/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            assert csrf
            await ui.post(
                "/ui/login", data={"csrf": csrf.group(1), "token": served.token, "next": "/"}
            )
            page = await ui.get(f"/ui/jobs/{child_id}")
            assert page.status_code == 200, page.text
            assert f'href="/ui/jobs/{waiting.job.id}"' in page.text
            assert "Waiting for 1 parent to end" in page.text
            assert "waits for 1 parent" in page.text
            listing = await ui.get("/ui/jobs")
            assert "waiting to be released" in listing.text and "9999" not in listing.text
    # A parked job is not due: no age in `pgworker status` (its parent, the one other pending
    # job, scheduled for later here).
    await conn.execute(
        "UPDATE pgworker.jobs SET run_at = now() + interval '1 hour' WHERE id = $1",
        waiting.job.id,
    )
    from pgworker.operations import status

    assert (await status(conn))["oldest_pending"] == []


async def test_the_fan_in_recipe_of_the_docs(dsn: str, conn: asyncpg.Connection) -> None:
    """docs/guide/workflows.md's recipe, run as written (examples/workflows/fan_in.py)."""
    from examples.workflows import fan_in

    texts = [f"{'word ' * n}".strip() for n in range(1, 21)]
    total_id = await fan_in.count_all(conn, texts)
    async with serving_guarded(fan_in.registry, dsn, concurrency=8):
        await wait_for(lambda: ended(conn, total_id), timeout=30)
    total = await job(conn, total_id)
    assert total.status == "completed" and total.result == sum(range(1, 21))
    assert len(total.parents or ()) == 20


async def test_an_enqueue_that_deadlocks_with_a_batch_of_outcomes_tries_again(
    dsn: str, conn: asyncpg.Connection
) -> None:
    """The one deadlock possible: a completer's batch holds a parent X (its outcome written) and
    its trigger then waits for a dependant C of another parent, while an enqueue after [C, X]
    holds C (locked first: id order) and waits for X. The enqueue, the victim (it waited first),
    undoes its savepoint, which lets the batch through, and tries again."""
    p1 = await pgworker.enqueue(conn, "square", {"n": 1})
    c = await pgworker.enqueue(conn, "total", after=[p1.job.id])
    x = await pgworker.enqueue(conn, "square", {"n": 2})
    batch = await asyncpg.connect(dsn)
    enqueuer = await asyncpg.connect(dsn)
    try:
        await batch.execute("SET deadlock_timeout = '5s'")  # the enqueue detects it first
        tr = batch.transaction()
        await tr.start()
        await batch.execute("UPDATE pgworker.jobs SET priority = 1 WHERE id = $1", x.job.id)

        async def enqueue() -> pgworker.EnqueueResult:
            async with enqueuer.transaction():
                return await pgworker.enqueue(enqueuer, "total", after=[c.job.id, x.job.id])

        async def waiting() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE pid = $1 AND wait_event_type = 'Lock'",
                    enqueuer.get_server_pid(),
                )
            )

        results: list[pgworker.EnqueueResult] = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                results.append(await enqueue())

            tg.start_soon(run)
            await wait_for(waiting, timeout=10)
            # The batch's trigger now wants C, held by the enqueue: a deadlock.
            await batch.execute("UPDATE pgworker.jobs SET priority = 1 WHERE id = $1", c.job.id)
            await tr.commit()
        (result,) = results
        assert result.created and result.job.parents == (c.job.id, x.job.id)
        assert result.job.parents_left == 2
    finally:
        await batch.close()
        await enqueuer.close()


async def test_drain_runs_a_fan_in_and_stops_at_a_dependant_still_waiting(
    conn: asyncpg.Connection,
) -> None:
    """pgworker.testing.drain runs parents, then their released dependant; a dependant whose
    parent nobody serves stays parked, and drain ends (its time travel skips parked jobs)."""
    from pgworker.testing import drain

    registry = make_registry()
    children = [(await pgworker.enqueue(conn, "square", {"n": n})).job.id for n in (1, 2, 3)]
    total = await pgworker.enqueue(conn, "total", after=children)
    orphan = await pgworker.enqueue(conn, "unserved")
    stuck = await pgworker.enqueue(conn, "total", after=[orphan.job.id])
    await drain(conn, registry)
    assert (await job(conn, total.job.id)).result == 14
    assert (await job(conn, stuck.job.id)).parents_left == 1


async def test_a_pruned_parent_takes_its_links_and_is_missing_from_ctx_parents(
    dsn: str, conn: asyncpg.Connection
) -> None:
    seen: dict[int, dict[int, Any]] = {}
    kept = await pgworker.enqueue(conn, "square", {"n": 1})
    gone = await pgworker.enqueue(conn, "square", {"n": 2})
    child = await pgworker.enqueue(conn, "total", after=[kept.job.id, gone.job.id])
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'completed', result = '1', finished_at = $2"
        " WHERE id = ANY($1)",
        [kept.job.id, gone.job.id],
        datetime.now(UTC) - timedelta(days=2),
    )
    await conn.execute("UPDATE pgworker.jobs SET finished_at = now() WHERE id = $1", kept.job.id)
    assert (await pgworker.prune(conn, older_than=86400))["completed"] == 1
    links = await conn.fetch("SELECT parent_id FROM pgworker.job_dependencies")
    assert [r["parent_id"] for r in links] == [kept.job.id]
    async with serving_guarded(make_registry(seen), dsn):
        await wait_for(lambda: ended(conn, child.job.id), timeout=30)
    assert seen[child.job.id] == {kept.job.id: ("completed", 1)}
    shown = await show_job(conn, child.job.id)
    assert shown is not None and shown["parents"] == {kept.job.id: "completed", gone.job.id: None}


# --- a hostile user's dependencies -----------------------------------------------------------


async def test_a_chain_of_500_dependants_is_cancelled_with_its_root(conn) -> None:
    """Cancelling the root of a chain of 500 dependants cancels all of them: the cancel must not
    fail on PostgreSQL's stack depth (each dependant's cancel fires the trigger again)."""
    root = await pgworker.enqueue(conn, "root", {})
    last = root.job.id
    for _ in range(500):
        last = (await pgworker.enqueue(conn, "child", {}, after=[last])).job.id
    await pgworker.cancel(conn, root.job.id)
    assert await has_status(conn, last, "cancelled")


async def test_an_endless_after_is_refused_not_read_forever(dsn, conn):
    import itertools

    with pytest.raises(pgworker.ValidationError, match="at most 1,000 parents") as caught:
        await pgworker.enqueue(conn, "x", {}, after=itertools.count(1))
    assert caught.value.field == "after"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
