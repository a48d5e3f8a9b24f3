"""The HTTP API: jobs enqueued, claimed and finished by workers in any language, and read by
operators. Its routes live in routes/, one router per resource, each route taking the server's
resources through a dependency (routes.common.Served); this module opens those resources and
includes the routers.

Each route validates with pgworker's own validators, runs the statements of sql/queries through
`Queries`, and answers with the models of answers.py: jobs keyed by their column names (JSON-safe:
times in ISO 8601, payload and result as JSON).

Every route's database work is one transaction, bounded (bounds.py), and its answer is rendered
(with the stdlib json, never re-serialised by FastAPI) inside that transaction, before the write
it reports commits: an answer that cannot be produced rolls the write back, and a write that
committed is never answered 500. One nesting limit holds for all the API reads and writes,
enqueue's (validate.MAX_DEPTH): deeper JSON is refused on the way in (422) and shown null, with
`unreadable`, on the way out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import FastAPI

from .. import _bulk as bulk
from .._db.connection import create_pool
from .._db.queries import queries
from .._logs import get_logger
from .._maintenance.maintenance import Maintenance
from .._waits import close as close_waiters
from ..settings import Settings
from ..worker import LOCK_TIMEOUT
from . import guard
from .bounds import client_check
from .config import WebConfig
from .routes import bulk as bulk_routes
from .routes import events, failures, health, jobs, queues, stats, workers
from .routes.common import Api, handle_errors

POOL_SIZE = 10

ROUTERS = (
    health.router,
    bulk_routes.router,
    jobs.router,
    workers.router,
    events.router,
    queues.router,
    stats.router,
    failures.router,
)
"""Every router of the API, in the order the document lists them."""


def install(app: FastAPI, config: WebConfig) -> None:
    """Add the API's routes, its middleware and its error handlers to `app`."""
    guard.install(app, config)
    app.state.api = Api(config, queries(config.schema), app.state)
    for router in ROUTERS:
        app.include_router(router)
    handle_errors(app)


@contextlib.asynccontextmanager
async def resources(app: Any, config: WebConfig, given: Any = None) -> AsyncIterator[None]:
    """The pool and queries every route uses, and the maintenance service (unless
    --no-maintenance), for the server's lifetime.

    Maintenance waits on a lock as the worker's does: at most a third of the lease, 5 s at most
    (lock_timeout on the pool's sessions, set when they connect, as the worker's pool sets it
    and plan_cache_mode), then retries and says so in the log; a request sets its own, shorter
    or not, with SET LOCAL (bounds.py). A startup parameter rather than SET LOCAL because
    maintenance sends its statements on the pool outside any transaction of its own: SET LOCAL
    would cost it a transaction and a round trip per statement. Through a transaction pooler
    (`--pooler`), which refuses startup parameters, that is what it costs."""
    settings = maintenance_settings(config) if config.maintenance else None
    pool = given or await create_pool(
        config.dsn,
        size=POOL_SIZE,
        application_name="pgworker:serve",
        lock_timeout=None if settings is None else min(settings.lease / 3, LOCK_TIMEOUT),
        pooler=config.pooler,
    )
    app.state.bulk = None
    maintenance: Maintenance | None = None
    try:
        await _ready(app, config, pool)
        async with anyio.create_task_group() as tg:
            if not config.read_only:
                # Bulk actions run here, in the background: those created by this server's
                # requests at once, those whose runner died (a server killed) from start-up.
                app.state.bulk = bulk.Runner(pool, config.schema, _holder(config))
                tg.start_soon(app.state.bulk.serve)
            if settings is not None:
                # serve's runner (above) adopts the bulk actions left running: not maintenance
                maintenance = Maintenance(pool, settings, bulk=False)
                tg.start_soon(maintenance.run, get_logger(worker_id=settings.worker_id))
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            if maintenance is not None:
                with contextlib.suppress(Exception):
                    await maintenance.resign()
            await close_waiters()
            app.state.pool = None
            if given is None:
                await pool.close()


async def _ready(app: Any, config: WebConfig, pool: Any) -> None:
    """What the routes (through routes.common.Api) and the dashboard read from app.state: the
    pool (set last: its presence says the rest is there), and whether the server takes
    client_connection_check_interval."""
    app.state.client_check = await client_check(pool, queries(config.schema))
    app.state.pool = pool


async def opened(app: Any, config: WebConfig, given: Any = None) -> None:
    """The resources of an application whose lifespan did not run (mounted in another one:
    Starlette runs no lifespan of a mounted application), opened at its first request, once:
    the pool `given` (the caller's, never closed here), or one of its own on the DSN, which then
    stays open as long as the process (pass a pool to close it yourself). No maintenance: the
    workers (`pgworker run`) or `pgworker serve` do it. The bulk actions do run here (unless
    read-only), as under `serve`'s lifespan: a runner in a task of its own, started once the
    pool is ready, for as long as the event loop (`_bulk.Runner`)."""
    if getattr(app.state, "pool", None) is not None:
        return
    async with app.state.opening:
        if getattr(app.state, "pool", None) is not None:
            return
        pool = given or await create_pool(
            config.dsn, size=POOL_SIZE, application_name="pgworker:web", pooler=config.pooler
        )
        try:
            await _ready(app, config, pool)
        except BaseException:
            if given is None:
                with anyio.CancelScope(shield=True):
                    await pool.close()
            raise
        if not config.read_only:
            runner = bulk.Runner(pool, config.schema, _holder(config))
            app.state.bulk = runner
            # A task of the event loop's, not of this request's: it outlives the request, and
            # a reference is kept on the application (the loop keeps only weak ones).
            app.state.bulk_task = asyncio.get_running_loop().create_task(runner.serve())


def _holder(config: WebConfig) -> bulk.Holder:
    """Who this application's bulk actions are run by: `serve` under its --worker-id's name, a
    mounted console under one of its own (`console-<host>-<pid>-<random>`)."""
    return bulk.Holder.of(config.runner_kind, config.worker_id or None)


def maintenance_settings(config: WebConfig) -> Settings:
    """The settings maintenance runs under: PGWORKER_* (lease, retention) as for `run`."""
    return Settings.from_env(
        dsn=config.dsn, schema=config.schema, worker_id=config.worker_id or None
    )
