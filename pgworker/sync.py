"""Enqueue from synchronous code: a psycopg 3 `Connection`, a SQLAlchemy `Connection` or
`Session`, or Django's `connection` (`django.db.connection` or `connections[alias]`).

The job is written in that connection's transaction and exists only if it commits: inside
Django's `transaction.atomic`, no `transaction.on_commit` is needed. The checks, statements,
results and errors are those of `pgworker.enqueue`, which runs here without an event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from ._drivers import adapt_sync, run_sync
from .enqueue import enqueue as _enqueue
from .enqueue import enqueue_many as _enqueue_many
from .models import DEFAULT_SCHEMA, EnqueueResult, JobSpec


def enqueue(
    conn: Any,
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | str | None = None,
    max_retries: int | None = None,
    idempotency_key: str | None = None,
    correlation_id: str | None = None,
    run_at: datetime | None = None,
    delay: timedelta | float | None = None,
    version: int | None = None,
    concurrency_key: str | None = None,
    after: Sequence[int] | None = None,
    on_parent_failure: str | None = None,
    unique_key: str | None = None,
    unique_states: Sequence[str] | None = None,
    unique_period: timedelta | float | None = None,
    replace: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> EnqueueResult:
    """`pgworker.enqueue` for a synchronous connection (see the module's docstring): the same
    arguments (pgworker.models.EnqueueOptions), checks, results and errors."""
    return run_sync(
        _enqueue(
            adapt_sync(conn),
            type,
            payload,
            queue=queue,
            priority=priority,
            max_retries=max_retries,
            idempotency_key=idempotency_key,
            correlation_id=correlation_id,
            run_at=run_at,
            delay=delay,
            version=version,
            concurrency_key=concurrency_key,
            after=after,
            on_parent_failure=on_parent_failure,
            unique_key=unique_key,
            unique_states=unique_states,
            unique_period=unique_period,
            replace=replace,
            schema=schema,
        )
    )


def enqueue_many(
    conn: Any, specs: Sequence[JobSpec], *, schema: str = DEFAULT_SCHEMA
) -> list[EnqueueResult]:
    """`pgworker.enqueue_many` for a synchronous connection: all or nothing, in a savepoint
    inside the connection's transaction."""
    return run_sync(_enqueue_many(adapt_sync(conn), specs, schema=schema))
