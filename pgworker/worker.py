"""The Worker: a pool, the listener, the producer (with its slots and heartbeat), the completer
and maintenance in one task group. `async with Worker(...)` serves in the background; leaving
the block stops gracefully."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from . import db
from .completer import Completer
from .errors import ConfigError
from .logs import get_logger
from .maintenance import Maintenance
from .notifier import Notifier, Wakeup
from .producer import Producer
from .registry import Registry
from .settings import Settings, dsn_from_env


class Worker:
    """Serves the tasks of `registry` from `queues` (default: `default`).

    Pass `settings=Settings(...)` for full control, or the common options as keywords
    (`poll_interval`, `shutdown_timeout`, `lease`, `listen`, `worker_id`, `schema`, ...).
    """

    def __init__(
        self,
        registry: Registry,
        dsn: str | None = None,
        *,
        concurrency: int = 10,
        queues: list[str] | tuple[str, ...] | None = None,
        settings: Settings | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(registry, Registry):
            raise ConfigError("registry", f"must be a pgworker.Registry, got {registry!r}")
        if len(registry) == 0:
            raise ConfigError("registry", "has no tasks; register handlers with @registry.task")
        if settings is None:
            if queues is not None:
                options["queues"] = tuple(queues)
            settings = Settings(dsn=dsn or dsn_from_env() or "", concurrency=concurrency, **options)
        self.settings = settings
        self.registry = registry
        self._wakeup = Wakeup()
        self._producer: Producer | None = None
        self._stop_requested = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._log = get_logger(worker_id=settings.worker_id)

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

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until `stop()`. Raises SchemaError or DatabaseUnavailable before serving."""
        await self._serve(await self._open(), task_status=task_status)

    async def _open(self) -> Any:
        pool = await db.create_pool(
            self.settings.dsn, size=3, application_name=f"pgworker:{self.settings.worker_id}"
        )
        try:
            await db.check_schema(pool, self.settings.schema)
        except BaseException:
            await pool.close()
            raise
        return pool

    async def _serve(
        self, pool: Any, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        s = self.settings
        try:
            completer = Completer(
                pool,
                s.schema,
                s.worker_id,
                on_requeued=lambda delay: producer.requeued(delay),
                give_up_after=max(s.shutdown_timeout, s.lease),
            )
            producer = Producer(pool, self.registry, s, completer, self._wakeup)
            await producer.register()
            async with anyio.create_task_group() as tg:
                if s.listen:
                    notifier = Notifier(
                        s.dsn, s.schema, s.queues, self._wakeup, producer.cancel, s.worker_id
                    )
                    await tg.start(notifier.run)
                tg.start_soon(completer.run)
                tg.start_soon(producer.heartbeat)
                tg.start_soon(Maintenance(s).run)
                self._producer = producer
                if self._stop_requested:
                    producer.stop()
                self._log.info(
                    "worker started",
                    queues=list(s.queues),
                    tasks=[t.name for t in self.registry],
                    concurrency=s.concurrency,
                    listen=s.listen,
                )
                task_status.started()
                await producer.run()
                completer.close()
                await completer.finished.wait()
                tg.cancel_scope.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await db.unregister_worker(pool, s.schema, s.worker_id)
            self._log.info(
                "worker stopped",
                outcomes_written=completer.written,
                outcomes_dropped=completer.dropped,
            )
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await pool.close()

    async def __aenter__(self) -> Worker:
        pool = await self._open()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self._tg.start(self._serve, pool)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.stop()
        assert self._tg is not None
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            return await self._tg.__aexit__(exc_type, exc, tb)
        # An error in the block still gets a graceful stop; the error then propagates.
        await self._tg.__aexit__(None, None, None)
        return None
