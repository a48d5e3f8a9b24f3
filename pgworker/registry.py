"""Handlers and their task options, and loading the registry that `pgworker run` serves."""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _limits as limits
from .errors import ConfigError
from .models import DEFAULT_MAX_RETRIES, DEFAULT_QUEUE
from .retry import RetryPolicy

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Task:
    """A job type and how to run it. `retry.max_retries` is the default a job gets when its
    enqueuer gave none."""

    name: str
    fn: Handler
    queue: str
    priority: int
    timeout: float | None
    retry: RetryPolicy
    is_async: bool


class Registry:
    """The handlers a worker serves, keyed by job type."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def task(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        priority: int | str = 0,
        queue: str = DEFAULT_QUEUE,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register `fn(ctx, payload)` as the handler of job type `name`. `async def` handlers run
        on the event loop; plain `def` handlers run in a worker thread."""
        if not isinstance(name, str) or not name:
            raise ConfigError("name", f"must be a non-empty string, got {name!r}")
        if name in self._tasks:
            raise ConfigError("name", f"task {name!r} is already registered")
        if not isinstance(queue, str) or not queue:
            raise ConfigError("queue", f"must be a non-empty string, got {queue!r}")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigError("timeout", f"must be a number of seconds > 0, got {timeout!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError("retry", f"must be a pgworker.RetryPolicy, got {retry!r}")
        policy = retry or RetryPolicy(max_retries=DEFAULT_MAX_RETRIES)
        if max_retries is not None:
            if retry is not None and retry.max_retries != max_retries:
                raise ConfigError(
                    "max_retries",
                    f"{max_retries} differs from retry.max_retries={retry.max_retries}; give one",
                )
            policy = RetryPolicy(max_retries, policy.initial_delay, policy.max_delay, policy.jitter)
        prio = limits.priority("priority", priority, error=ConfigError)

        def register(fn: Handler) -> Handler:
            if not callable(fn):
                raise ConfigError("handler", f"{fn!r} is not callable")
            self._tasks[name] = Task(
                name=name,
                fn=fn,
                queue=queue,
                priority=prio,
                timeout=float(timeout) if timeout is not None else None,
                retry=policy,
                is_async=inspect.iscoroutinefunction(fn),
            )
            return fn

        return register

    def __getitem__(self, name: str) -> Task:
        return self._tasks[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def queues(self) -> list[str]:
        return sorted({t.queue for t in self._tasks.values()})

    async def enqueue(self, conn: Any, type: str, payload: Any = None, **options: Any) -> Any:
        """`pgworker.enqueue` with this registry's task defaults for queue, priority and
        max_retries where the caller gives none."""
        from .enqueue import enqueue

        task = self._tasks.get(type)
        if task is not None:
            defaults = {
                "queue": task.queue,
                "priority": task.priority,
                "max_retries": task.retry.max_retries,
            }
            for name, value in defaults.items():
                if options.get(name) is None:
                    options[name] = value
        return await enqueue(conn, type, payload, **options)


def load(target: str) -> Registry:
    """Import `MODULE[:ATTR]` and return its Registry. The current directory is importable, as
    with `python -m`."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise ConfigError("module", f"{target!r} must be MODULE or MODULE:ATTR")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("module", f"cannot import {module_name!r}: {exc}") from exc
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, Registry):
            raise ConfigError("module", f"{target!r} is not a pgworker.Registry")
        return found
    registries = [v for v in vars(module).values() if isinstance(v, Registry)]
    if len(registries) != 1:
        raise ConfigError(
            "module",
            f"{module_name!r} holds {len(registries)} pgworker.Registry objects; "
            f"name one as {module_name}:ATTR",
        )
    return registries[0]
