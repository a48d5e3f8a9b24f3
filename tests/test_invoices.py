"""Seed 003's invoice example under the worst case: the worker is killed after the invoice is
written and before the job is acknowledged, the job is rescued, and an operator replays it twice.
Exactly one invoice per order."""

from __future__ import annotations

import pytest

import pgworker
from examples.invoices import repository, service

from .helpers import attempts, cli, has_status, spawn_worker, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

ORDERS = ["A-1001", "A-1002"]


async def test_one_invoice_per_order_after_a_kill_a_rescue_and_two_replays(dsn, conn, tmp_path):
    await repository.create_schema(conn)
    jobs = {o: (await service.request_invoice(conn, o, 1200)).job.id for o in ORDERS}
    again = await service.request_invoice(conn, ORDERS[0], 1200)  # the order clicked twice
    assert not again.created and again.job.id == jobs[ORDERS[0]]

    crash, mail_down = tmp_path / "crash", tmp_path / "mail-down"
    crash.mkdir()
    mail_down.touch()
    env = {"INVOICE_MAX_RETRIES": "0", "INVOICE_MAIL_DOWN": str(mail_down)}
    first = spawn_worker(
        "examples.invoices.tasks",
        dsn,
        tmp_path / "first.log",
        "--lease",
        "2",
        env={**env, "INVOICE_CRASH_DIR": str(crash)},
    )
    try:
        # Each first attempt wrote its invoice and its checkpoint, then stops at the barrier.
        await wait_for(lambda: all((crash / f"{o}.created").exists() for o in ORDERS), timeout=30)
    finally:
        first.kill()
        first.wait()
    for o in ORDERS:
        assert len(await repository.invoices_of(conn, o)) == 1
        assert await has_status(conn, jobs[o], "running")

    second = spawn_worker(
        "examples.invoices.tasks", dsn, tmp_path / "second.log", "--lease", "2", env=env
    )
    try:
        # The rescue: out of retries (max_retries 0), each job fails as lost.
        for o in ORDERS:
            await wait_for(lambda o=o: has_status(conn, jobs[o], "failed"), timeout=30)
        # Replay 1: the invoice step is done (no second insert); the notification fails for good.
        ids = [str(jobs[o]) for o in ORDERS]
        out = cli("replay", *ids, "--reason", "worker killed", "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        for o in ORDERS:
            await wait_for(lambda o=o: _outcomes_are(conn, jobs[o], ["lost", "failed"]), timeout=30)
        # Replay 2, once the mail service is back: the job completes.
        mail_down.unlink()
        out = cli("replay", *ids, "--reason", "mail service back", "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        for o in ORDERS:
            await wait_for(lambda o=o: has_status(conn, jobs[o], "completed"), timeout=30)
    finally:
        second.terminate()
        second.wait()

    for o in ORDERS:
        [invoice] = await repository.invoices_of(conn, o)
        job = await pgworker.get_job(conn, jobs[o])
        assert job.result == {"invoice_id": invoice.id}
        assert [a["attempt"] for a in await attempts(conn, jobs[o])] == [1, 2, 3]
        assert [a["outcome"] for a in await attempts(conn, jobs[o])] == [
            "lost",
            "failed",
            "completed",
        ]
        assert job.progress["milestone"] == "customer notified"
        replays = await conn.fetch(
            "SELECT reason FROM pgworker.job_events WHERE job_id = $1 AND kind = 'replayed' "
            "ORDER BY id",
            jobs[o],
        )
        assert [r["reason"] for r in replays] == ["worker killed", "mail service back"]
    assert await conn.fetchval("SELECT count(*) FROM invoices") == len(ORDERS)


async def _outcomes_are(conn, job_id: int, expected: list[str]) -> bool:
    return [a["outcome"] for a in await attempts(conn, job_id)] == expected


async def test_the_order_id_is_validated_before_anything_is_written(conn):
    await repository.create_schema(conn)
    for bad in ["", "A 1", None, "x" * 65]:
        with pytest.raises(pgworker.ValidationError) as caught:
            await service.request_invoice(conn, bad, 100)
        assert caught.value.field == "order_id"
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0


async def test_create_if_absent_returns_the_existing_invoice(conn):
    await repository.create_schema(conn)
    first = await repository.create_if_absent(conn, "B-1", 10)
    second = await repository.create_if_absent(conn, "B-1", 10)
    assert first.created and not second.created and first.id == second.id


async def test_a_bad_retry_configuration_stops_the_start_up():
    with pytest.raises(pgworker.ConfigError):
        service.retry_policy({"INVOICE_MAX_RETRIES": "many"})
    with pytest.raises(pgworker.ConfigError):
        service.retry_policy({"INVOICE_MAX_ELAPSED": "-1"})


async def test_a_bad_retry_variable_is_named():
    with pytest.raises(pgworker.ConfigError) as caught:
        service.retry_policy({"INVOICE_RETRY_DELAY": "soon"})
    assert caught.value.field == "INVOICE_RETRY_DELAY"
