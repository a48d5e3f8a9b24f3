"""The shop's jobs tested with pgworker.testing: run with `python -m pytest` from this directory
and PGWORKER_TEST_DSN set (the conftest.py here loads the plugin)."""

from datetime import timedelta

import asyncpg
import pytest
import shop

from pgworker.testing import assert_enqueued, assert_not_enqueued, drain, run_job


async def test_placing_an_order_enqueues_its_receipt(db: asyncpg.Connection) -> None:
    await shop.place_order(db, 1, "ada@example.org")
    job = await assert_enqueued(
        db, "send-receipt", payload={"order_id": 1, "email": "ada@example.org"}
    )
    assert job.idempotency_key == "receipt-1" and job.status == "pending"


async def test_an_order_placed_twice_enqueues_one_receipt(db: asyncpg.Connection) -> None:
    first = await shop.place_order(db, 1, "ada@example.org")
    again = await shop.place_order(db, 1, "ada@example.org")
    assert first == again
    await assert_enqueued(db, "send-receipt", payload_contains={"order_id": 1}, count=1)


async def test_a_rolled_back_order_enqueues_nothing(db: asyncpg.Connection) -> None:
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await shop.place_order(db, 2, "bob@example.org")  # a savepoint inside
            raise RuntimeError("payment declined")
    await assert_not_enqueued(db, "send-receipt")


async def test_the_receipt_is_mailed_and_a_review_asked_a_week_later(
    db: asyncpg.Connection,
) -> None:
    await shop.place_order(db, 1, "ada@example.org")
    ran = await drain(db, shop.registry)
    assert ran.outcomes() == ["completed"]
    assert shop.outbox == [{"to": "ada@example.org", "subject": "Your order 1"}]
    review = await assert_enqueued(db, "ask-review", status="pending")

    await drain(db, shop.registry, until=timedelta(days=6))  # not yet
    await assert_enqueued(db, "ask-review", status="pending")
    ran = await drain(db, shop.registry, until=timedelta(days=1))
    assert ran.completed == [review.id]
    assert shop.outbox[-1]["subject"] == "How was order 1?"


async def test_a_mail_outage_is_retried_with_backoff_and_mails_once(
    db: asyncpg.Connection,
) -> None:
    shop.mail_down_for = 2
    job_id = await shop.place_order(db, 1, "ada@example.org")
    ran = await drain(db, shop.registry)  # the first attempt fails; its retry is a minute away
    assert ran.outcomes() == ["retried"]
    ran = await drain(db, shop.registry, until=timedelta(minutes=10))
    assert ran.outcomes(job_id) == ["retried", "completed"]
    assert len(shop.outbox) == 1


async def test_a_bad_address_fails_for_good(db: asyncpg.Connection) -> None:
    job_id = await shop.place_order(db, 1, "not-an-address")
    ran = await drain(db, shop.registry)
    assert ran.failed == [job_id]
    job = await assert_enqueued(db, "send-receipt", status="failed")
    assert job.error == "PermanentError: not an address: 'not-an-address'"


async def test_the_handler_alone_without_a_database() -> None:
    run = await run_job(shop.registry, "ask-review", {"order_id": 3, "email": "eve@example.org"})
    assert (run.outcome, run.result, run.ran_steps) == ("completed", "msg-1", ["mail"])
    assert shop.outbox == [{"to": "eve@example.org", "subject": "How was order 3?"}]


async def test_a_retried_receipt_does_not_mail_twice() -> None:
    # The steps an earlier attempt recorded are not run again.
    run = await run_job(
        shop.registry,
        "send-receipt",
        {"order_id": 4, "email": "ada@example.org"},
        attempt=2,
        steps={"mail": "msg-9", "review": 12},
    )
    assert run.result == {"message": "msg-9", "review_job": 12}
    assert run.ran_steps == [] and shop.outbox == []
    assert run.progress is not None and run.progress["milestone"] == "mailed"
