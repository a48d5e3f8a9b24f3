"""The Worker: a pool, and the services that share it (claims with their slots, heartbeat,
completer, listener, and the maintenance's: the leadership's renewal and each duty it runs),
each run by the one supervised loop of _runtime/service.py, all reporting a lost database to one
Contact.

Start-up either completes or raises one documented error (DatabaseUnavailable, SchemaError,
ConfigError, PrivilegeError) with everything it opened closed. `async with Worker(...)` serves in
the background and works inside any enclosing task group; leaving the block stops gracefully."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

import anyio
import anyio.abc
import anyio.to_thread
import asyncpg

from . import _threads
from ._db.connection import (
    DSN_OPTIONS,
    create_pool,
    migrate_command,
    pooler_refusal,
    privilege_error,
    too_many_connections,
)
from ._db.migrations import check_direct, check_privileges, check_schema
from ._db.queries import queries
from ._logs import get_logger
from ._maintenance.maintenance import Maintenance
from ._maintenance.periodic import Periodic
from ._redact import describe
from ._runtime import health_file as _health_file
from ._runtime.completer import Completer
from ._runtime.heartbeat import Heartbeat
from ._runtime.notifier import LISTEN_DSN_OPTIONS, Notifier, Wakeup
from ._runtime.producer import Producer
from ._runtime.service import Contact, Health, Joint, supervise
from ._runtime.turns import Turns
from .errors import ConfigError, DatabaseUnavailable, PgWorkerError, SchemaError
from .models import DEFAULT_QUEUE
from .registry import Registry, served_key
from .settings import Settings, WorkerOptions, dsn_from_env

if TYPE_CHECKING:
    from ._runtime.metrics import Metrics

POOL_SIZE = 2
"""The claims' connection and the one the rest take turns on (SharedConnection)."""
LOCK_TIMEOUT = 5.0
"""The longest a worker's statement waits on a lock (shorter with a short lease): a row an
operator holds locked makes that service retry and say so in `health()`, not hang."""


class _Services:
    """What a started worker holds: the pool and its services."""

    def __init__(self, worker: Worker, pool: asyncpg.Pool, metrics: Metrics | None) -> None:
        s = worker.settings
        self.pool = pool
        self.completer = Completer(
            pool,
            s.schema,
            s.worker_id,
            on_requeued=lambda delay: self.producer.requeued(delay),
            on_settled=metrics.settled if metrics is not None else lambda result, outcome: None,
            freed=lambda batch: self.producer.room_to_pass_on(batch),
            give_up_after=max(s.shutdown_timeout, s.lease),
            pooler=s.pooler,
        )
        served = [served_key(t, v) for t, v in worker.registry.served()]
        # LISTEN needs a session of its own: through a transaction pooler, only on listen_dsn.
        # Without one, every worker polls at each interval and no one takes turns.
        listens = s.listen and (s.listen_dsn is not None or not s.pooler)
        self.turns = Turns(s, served) if listens else None
        self.producer = Producer(
            pool,
            worker.registry,
            s,
            self.completer,
            worker._wakeup,
            metrics=metrics,
            turns=self.turns,
        )
        self.heartbeat = Heartbeat(self.producer, s)
        self.maintenance = Maintenance(
            self.completer.shared,
            s,
            worker.registry,
            stopping=self.producer.stopped,
            metrics=metrics,
        )
        schedules = worker.registry.schedules()
        self.periodic = (
            Periodic(self.completer.shared, s, schedules, stopping=self.producer.stopped)
            if schedules
            else None
        )
        self.notifier = (
            Notifier(
                s.listen_dsn or s.dsn,
                s.schema,
                self.turns,
                worker._wakeup,
                self.producer.cancel,
                s.worker_id,
                where=LISTEN_DSN_OPTIONS if s.listen_dsn is not None else DSN_OPTIONS,
            )
            if self.turns is not None
            else None
        )


class Worker:
    """Serves the tasks of `registry`: by default from every queue its tasks name, and `default`.

    Pass `settings=Settings(...)` for full control, or the common options as keywords
    (`poll_interval`, `shutdown_timeout`, `lease`, `listen`, `worker_id`, `schema`, ...).
    """

    def __init__(
        self,
        registry: Registry,
        dsn: str | None = None,
        *,
        concurrency: int | None = None,
        queues: list[str] | tuple[str, ...] | None = None,
        settings: Settings | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        if not isinstance(registry, Registry):
            raise ConfigError("registry", f"must be a pgworker.Registry, got {registry!r}")
        if len(registry) == 0:
            raise ConfigError("registry", "has no tasks; register handlers with @registry.task")
        served = tuple(dict.fromkeys([DEFAULT_QUEUE, *registry.queues()]))
        given = (dsn, concurrency, queues)
        if settings is not None and (any(v is not None for v in given) or options):
            raise ConfigError(
                "settings", "give settings=Settings(...) or the options as keywords, not both"
            )
        if settings is None:
            values: dict[str, Any] = dict(options)
            if queues is not None:
                names: object = queues  # a str is refused by Settings, naming the field
                values["queues"] = names if isinstance(names, str) else tuple(queues)
            elif values.get("queues") is None:
                values["queues"] = served
            if concurrency is not None:
                values["concurrency"] = concurrency
            unknown = sorted(set(values) - {f.name for f in dataclasses.fields(Settings)})
            if unknown:
                known = ", ".join(f.name for f in dataclasses.fields(Settings) if f.name != "dsn")
                raise ConfigError(unknown[0], f"is not a Worker option; the options are {known}")
            settings = Settings(dsn=dsn or dsn_from_env() or "", **values)
        elif settings.queues is None:
            settings = dataclasses.replace(settings, queues=served)
        self.settings = settings
        self.registry = registry
        self._wakeup = Wakeup()
        self._producer: Producer | None = None
        self._stop_requested = False
        self._healths: dict[str, Health | Joint] = {}
        self._context: contextlib.AbstractAsyncContextManager[Worker] | None = None
        self._running = False
        self._health_file_failed = False
        self.abandoned = 0
        """Handlers abandoned at the last stop because they ignored their cancellation (their
        jobs were handed back; their tasks still run in this event loop)."""
        self._log = get_logger(worker_id=settings.worker_id)
        if settings.metrics_port is not None:
            from ._runtime import metrics as _metrics

            _metrics.require()

    @property
    def worker_id(self) -> str:
        return self.settings.worker_id

    def stop(self) -> None:
        """Stop claiming; running jobs get `shutdown_timeout` seconds, then are handed back."""
        self._stop_requested = True
        if self._producer is not None:
            self._producer.stop()

    def interrupt(self) -> None:
        """Stop now: running jobs are handed back to pending at once."""
        self._stop_requested = True
        if self._producer is not None:
            self._producer.interrupt()

    def health(self) -> dict[str, dict[str, Any]]:
        """Per service (producer, heartbeat, completer, notifier, maintenance): `state` ("ok",
        "retrying" or "stopped"), `last_success` (a datetime or None), `consecutive_failures`
        and `last_error` (text or None). Empty before the worker starts."""
        return {name: health.as_dict() for name, health in self._healths.items()}

    def _write_health_file(self, *, strict: bool = False) -> None:
        """Rewrite the health file (`Settings.health_file`), if any. A write that fails is logged
        once, not raised: the file goes stale, and that is what the probe reports. `strict` (at
        start-up): a path that cannot be written is a ConfigError."""
        path = self.settings.health_file
        if path is None:
            return
        content = _health_file.record(
            self.worker_id, self.settings.lease, self.health(), self._stop_requested
        )
        try:
            _health_file.write(path, content)
        except Exception as exc:
            if strict:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise ConfigError("health_file", f"cannot write {path!r}: {reason}") from None
            if not self._health_file_failed:
                self._log.warning("could not write the health file", path=path, error=describe(exc))
            self._health_file_failed = True
        else:
            self._health_file_failed = False

    async def _write_health_file_often(self) -> None:
        """Every third of the lease (the heartbeat's period), whatever the services' states: a
        service that retries does not make the file stale, a frozen event loop does."""
        while True:
            self._write_health_file()
            await anyio.sleep(self.settings.lease / 3)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `stop()`. Raises DatabaseUnavailable, SchemaError or PrivilegeError before
        serving when the worker cannot start."""
        async with self._started() as services:
            await self._serve(services, task_status=task_status)

    @contextlib.asynccontextmanager
    async def _started(self) -> AsyncIterator[_Services]:
        """Open the pool, check the schema and the role's privileges, register, and open the
        listener; close all of it when done, or at once when a step fails."""
        s = self.settings
        if self._running:
            raise ConfigError("worker", "is already running: a Worker serves once at a time")
        self._running = True
        _threads.serving()
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._ended)
            self._healths = {}
            self._write_health_file(strict=True)
            metrics = None
            if s.metrics_port is not None:
                from ._runtime.metrics import Metrics

                metrics = Metrics(s)
                metrics.start()
                stack.push_async_callback(_close_metrics, metrics)
            pool = await create_pool(
                s.dsn,
                size=POOL_SIZE,
                application_name=f"pgworker:{s.worker_id}",
                lock_timeout=min(s.lease / 3, LOCK_TIMEOUT),
                pooler=s.pooler,
                keyed=True,
            )
            stack.push_async_callback(_close_pool, pool)
            services = _Services(self, pool, metrics)
            if metrics is not None:
                self._watch(metrics, services)
            registered = False
            try:
                await check_schema(pool, s.schema)
                if not s.pooler:
                    await check_direct(pool, s.schema)
                else:
                    await self._pooled_functions(pool)
                await check_privileges(pool, s.schema, periodic=bool(self.registry.schedules()))
                await services.heartbeat.register()
                registered = True
                if services.notifier is not None:
                    _, services.notifier.database = await queries(s.schema).session_identity(pool)
                    await services.notifier.connect()
                    stack.callback(services.notifier.close)
            except Exception as exc:
                if registered:  # a worker that never served is no live worker in `status`
                    with contextlib.suppress(Exception), anyio.move_on_after(5):
                        await services.heartbeat.unregister()
                        await services.completer.shared.drop()
                raise _start_error(s.schema, exc) from exc
            yield services

    async def _pooled_functions(self, pool: asyncpg.Pool) -> None:
        """Pooler mode's functions (Queries.pooled_functions), made where missing. Without them
        the worker still serves, each statement planned at every execution: what keeps them
        from being made is said once, never a reason not to start."""
        try:
            unmade = await queries(self.settings.schema).pooled_functions(pool)
        except asyncpg.PostgresError as exc:
            unmade = [f"all: {type(exc).__name__}: {exc}"]
        if unmade:
            self._log.warning(
                "pooled functions missing: each claim and outcome write is planned at "
                "every execution; run `pgworker migrate --pooler` with this release, or "
                "grant the worker's role CREATE on the schema (EXECUTE on the functions "
                "where they are)",
                functions=unmade,
            )

    def _watch(self, metrics: Metrics, services: _Services) -> None:
        """What the metrics read from the running services at each scrape."""
        running = services.producer.running
        notifier = services.notifier
        metrics.busy = lambda: len(running)

        def reconnects() -> int:
            lost = sum(
                h.connections_lost for n, h in list(self._healths.items()) if n != "notifier"
            )
            return lost + (notifier.reconnects if notifier is not None else 0)

        metrics.reconnects = reconnects

    def _ended(self) -> None:
        """Ready to run again: a stop asked for belonged to the run that ended."""
        self._running = False
        self._stop_requested = False
        self._producer = None

    async def _serve(
        self,
        services: _Services,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        s = self.settings
        producer, completer = services.producer, services.completer
        running: list[Any] = [services.completer, services.heartbeat]
        if services.periodic is not None:
            running.append(services.periodic)
        if services.notifier is not None:
            running.append(services.notifier)
        contact = Contact(self._log)
        healths = {svc.name: Health(contact) for svc in [producer, *running]}
        self._healths = {
            **healths,
            "maintenance": services.maintenance.health,
        }
        try:
            async with anyio.create_task_group() as tg:
                if s.health_file is not None:
                    tg.start_soon(self._write_health_file_often)
                for svc in running:
                    tg.start_soon(supervise, svc, healths[svc.name], self._log)
                tg.start_soon(services.maintenance.run, self._log, contact)
                await tg.start(services.heartbeat.guard)
                self._producer = producer
                if self._stop_requested:
                    producer.stop()
                self._log.info(
                    "worker started",
                    queues=list(s.served_queues),
                    tasks=[t.name for t in self.registry],
                    concurrency=s.concurrency,
                    listen=services.notifier is not None,
                    pooler=s.pooler,
                )
                task_status.started()
                try:
                    await producer.run(healths[producer.name])
                finally:
                    self.abandoned = producer.abandoned
                completer.close()
                await completer.finished.wait()
                tg.cancel_scope.cancel()
        finally:
            # Cancelled from outside, the services were cancelled with the worker: the outcomes
            # decided meanwhile (the running jobs handed back) are still written, then the
            # worker says goodbye, as at any stop.
            with anyio.CancelScope(shield=True):
                if not completer.finished.is_set():
                    await completer.flush()
                with anyio.move_on_after(5):
                    try:
                        await services.maintenance.resign()
                        if services.periodic is not None:
                            await services.periodic.resign()
                        await services.heartbeat.unregister()
                    except Exception as exc:
                        self._log.warning(
                            "could not unregister from the database", error=describe(exc)
                        )
                # Given back, so that closing the pool does not wait for it.
                await services.completer.shared.drop()
            contact.close()
            self._write_health_file()
            self._log.info(
                "worker stopped",
                outcomes_written=completer.written,
                outcomes_dropped=completer.dropped,
            )

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[Worker]:
        error: Exception | None = None
        async with self._started() as services, anyio.create_task_group() as tg:
            await tg.start(lambda task_status: self._serve(services, task_status=task_status))
            try:
                yield self
            except Exception as exc:
                # An error in the block still gets a graceful stop; it propagates after.
                error = exc
            finally:
                self.stop()
        if error is not None:
            raise error

    async def __aenter__(self) -> Worker:
        context = self._serving()
        worker = await context.__aenter__()
        self._context = context
        return worker

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        context, self._context = self._context, None
        assert context is not None, "Worker.__aexit__ without __aenter__"
        return await context.__aexit__(exc_type, exc, tb)


async def _close_pool(pool: asyncpg.Pool) -> None:
    with anyio.CancelScope(shield=True):
        with anyio.move_on_after(5) as waited:
            await pool.close()
        if waited.cancelled_caught:  # a connection stayed busy: stop waiting on it
            pool.terminate()


async def _close_metrics(metrics: Metrics) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(metrics.close)


def _start_error(schema: str, exc: Exception) -> Exception:
    """The one documented error a failed start-up raises."""
    if isinstance(exc, PgWorkerError):
        return exc
    pooler = pooler_refusal(exc)
    if pooler is not None:
        return pooler
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return privilege_error(schema, exc)
    if isinstance(exc, asyncpg.exceptions.TooManyConnectionsError):
        return too_many_connections(exc)
    if isinstance(
        exc,
        asyncpg.exceptions.UndefinedTableError
        | asyncpg.exceptions.UndefinedColumnError
        | asyncpg.exceptions.InvalidSchemaNameError
        | asyncpg.exceptions.UndefinedFunctionError,
    ):
        return SchemaError(
            f"the pgworker schema {schema!r} does not match this pgworker ({describe(exc)}); "
            f"run `{migrate_command(schema)}`"
        )
    return DatabaseUnavailable(f"the worker could not start: {describe(exc)}")
