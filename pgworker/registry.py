"""Handlers and their task options, the handles `@registry.task` gives to enqueue them by, and
loading the registry that `pgworker run` serves."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar, Unpack

from . import _schedule
from . import _validate as validate
from ._payloads import payload_type
from ._schedule import Schedule
from ._task import Handler as Handler
from ._task import Task as Task
from ._task import Upgrader as Upgrader
from ._task import served_key as served_key
from .enqueue import _payload, enqueue, enqueue_many
from .errors import ConfigError, ValidationError
from .models import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_QUEUE,
    DEFAULT_SCHEMA,
    EnqueueOptions,
    EnqueueResult,
    JobSpec,
)
from .retry import RetryPolicy

_SHOWN_TASKS = 20
"""The most task names an error about an unknown type lists."""

P = ParamSpec("P")
R = TypeVar("R")


def _with_defaults(task: Task, options: EnqueueOptions) -> EnqueueOptions:
    """`options` with the task's queue, priority, max_retries and version where the caller
    gave none (or None)."""
    if options.get("queue") is None:
        options["queue"] = task.queue
    if options.get("priority") is None:
        options["priority"] = task.priority
    if options.get("max_retries") is None:
        options["max_retries"] = task.retry.max_retries
    if options.get("version") is None:
        options["version"] = task.version
    if options.get("unique_key") is not None:
        if options.get("unique_states") is None:
            options["unique_states"] = task.unique_states
        if options.get("unique_period") is None:
            options["unique_period"] = task.unique_period
    return options


def _checked(task: Task, payload: Any, field: str) -> Any:
    """The payload as stored: checked against the task's payload type and made JSON when it has
    one (ValidationError naming the path under `field`), else as given."""
    if task.payload_type is None:
        return payload
    return task.payload_type.encode(payload, field)


class TaskHandle(Generic[P, R]):
    """What `@registry.task(...)` gives: the job type to enqueue by, with the task's queue,
    priority, max_retries and version applied where the caller gives none, and its payload
    checked against the handler's payload type (when it declares one) before anything is
    written. Calling it calls the handler, as the function it decorates did (for tests)."""

    def __init__(self, task: Task) -> None:
        functools.update_wrapper(self, task.fn)
        self.task = task
        """The task's definition (pgworker.Task)."""

    @property
    def name(self) -> str:
        """The job type."""
        return self.task.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.task.fn(*args, **kwargs)
        return result

    def __repr__(self) -> str:
        return f"<pgworker.TaskHandle {self.task.name!r} of {self.task.fn!r}>"

    async def enqueue(
        self,
        conn: Any,
        payload: Any = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """`pgworker.enqueue(conn, self.name, payload, **options)` with the task's defaults;
        `payload` may be an instance of the handler's payload type or a dict of its fields."""
        return await enqueue(
            conn,
            self.task.name,
            _checked(self.task, payload, "payload"),
            schema=schema,
            **_with_defaults(self.task, options),
        )

    async def enqueue_many(
        self,
        conn: Any,
        payloads: Iterable[Any],
        *,
        schema: str = DEFAULT_SCHEMA,
        **options: Unpack[EnqueueOptions],
    ) -> list[EnqueueResult]:
        """One job per payload, in one transaction (`pgworker.enqueue_many`), each with the
        same `options` (JobSpec's fields) and the task's defaults. A wrong payload raises
        ValidationError naming it (`payloads[3].amount`) and nothing of the batch is written."""
        task = self.task
        defaults = _with_defaults(task, options)
        specs = [
            JobSpec(task.name, _checked(task, p, f"payloads[{i}]"), **defaults)
            for i, p in enumerate(payloads)
        ]
        try:
            return await enqueue_many(conn, specs, schema=schema)
        except ValidationError as exc:
            raise _batch_error(exc) from None

    def spec(self, payload: Any = None, **options: Unpack[EnqueueOptions]) -> JobSpec:
        """A pgworker.JobSpec of this task for `enqueue_many`, its payload checked and the
        task's defaults applied."""
        task = self.task
        return JobSpec(
            task.name, _checked(task, payload, "payload"), **_with_defaults(task, options)
        )


def _batch_error(exc: ValidationError) -> ValidationError:
    """enqueue_many's error about `specs[3].payload` or `specs[3].queue`, in the handle's words:
    `payloads[3]`, or `queue` (an option, the same for every payload)."""
    at, dot, rest = exc.field.partition("].")
    if not exc.field.startswith("specs[") or not dot:
        return exc
    message = str(exc)[len(exc.field) + 2 :]
    if rest == "payload" or rest.startswith(("payload.", "payload[")):
        return ValidationError(f"payloads[{at[6:]}]{rest[7:]}", message)
    return ValidationError(rest, message)


class Registry:
    """The handlers a worker serves, keyed by job type."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self._schedules: dict[str, Schedule] = {}

    def task(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        priority: int | str = 0,
        queue: str = DEFAULT_QUEUE,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        version: int = 1,
        upgrade: Mapping[int, Upgrader] | None = None,
        max_running: int | None = None,
        max_running_per_key: int | None = None,
        rate_limit: str | None = None,
        unique_states: Sequence[str] | None = None,
        unique_period: float | None = None,
    ) -> Callable[[Callable[P, R]], TaskHandle[P, R]]:
        """Register `fn(ctx, payload)` as the handler of job type `name`, and give its
        TaskHandle (`await send_invoice.enqueue(conn, payload)`; calling it calls `fn`).
        `async def` handlers run on the event loop; plain `def` handlers run in a worker thread.

        When `payload` is annotated with a pydantic model, a dataclass or a TypedDict (or a type
        holding one: `Invoice | None`), that is the payload's schema, validated by pydantic for
        all three kinds (the `pydantic` extra; without it such an annotation is a ConfigError):
        checked when enqueued through the handle or `Registry.enqueue`, and decoded into that type
        before `fn` runs (after the upgraders); a stored payload that no longer fits fails the
        attempt at once, without retries, naming the path. Any other annotation, or none, leaves
        the payload plain JSON.

        `version` is the payload version the handler takes; the worker claims jobs of that
        version, and of each older version `v` from which `upgrade` leads to it: `upgrade[v]` is
        a plain function turning a payload of version `v` into one of `v + 1`, applied in turn
        before the handler runs (so `{1: f, 2: g}` lets a version-3 handler run jobs of versions
        1 and 2).

        Limits hold across every worker of the fleet, enforced in the claim (docs/guide/limits.md):
        `max_running` jobs of the task running at once; `max_running_per_key` running at once per
        `concurrency_key` given at enqueue, the keys served round-robin; `rate_limit` starts per
        period (`"10/s"`, `"600/m"`, `"1000/h"`, `"5000/d"`).

        `unique_states` and `unique_period` are the defaults of an enqueue that gives a
        `unique_key` (docs/guide/enqueue.md, "Unique jobs"), checked here."""
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
            policy = dataclasses.replace(policy, max_retries=max_retries)
        prio = validate.priority("priority", priority, error=ConfigError)
        version = validate.count("version", version, minimum=1, error=ConfigError)
        upgraders = _upgraders(upgrade, version)
        if max_running is not None:
            max_running = validate.count("max_running", max_running, minimum=1, error=ConfigError)
        if max_running_per_key is not None:
            max_running_per_key = validate.count(
                "max_running_per_key", max_running_per_key, minimum=1, error=ConfigError
            )
        rate = None
        if rate_limit is not None:
            rate = validate.rate("rate_limit", rate_limit, error=ConfigError)
        period = validate.unique_period(unique_period, error=ConfigError)
        validate.unique_states(unique_states, period, error=ConfigError)
        states = None if unique_states is None else tuple(unique_states)

        def register(fn: Callable[P, R]) -> TaskHandle[P, R]:
            if isinstance(fn, TaskHandle):  # stacked: the same handler under a second name
                fn = fn.task.fn
            if not callable(fn):
                raise ConfigError("handler", f"{fn!r} is not callable")
            task = Task(
                name=name,
                fn=fn,
                queue=queue,
                priority=prio,
                timeout=float(timeout) if timeout is not None else None,
                retry=policy,
                is_async=inspect.iscoroutinefunction(fn),
                version=version,
                upgrade=upgraders,
                payload_type=payload_type(fn, name),
                max_running=max_running,
                max_running_per_key=max_running_per_key,
                rate_limit=rate,
                unique_states=states,
                unique_period=period,
            )
            self._tasks[name] = task
            return TaskHandle(task)

        return register

    def periodic(
        self,
        task: str | TaskHandle[Any, Any],
        cron: str | None = None,
        *,
        every: float | timedelta | None = None,
        payload: Any = None,
        name: str | None = None,
        timezone: str = "UTC",
        catch_up: str = "latest",
        queue: str | None = None,
        priority: int | str | None = None,
    ) -> Schedule:
        """Enqueue a job of `task` (its type name, or the handle `@registry.task` gave; a task
        of this registry, registered before) at each slot of `cron` (5 fields, or 6 with the
        seconds first) in `timezone`, or `every` seconds (a number or a timedelta, whole
        seconds; slots are the multiples of it since the Unix epoch). One worker of the fleet
        enqueues each slot once, with the idempotency key `periodic:{name}:{slot}` and the slot
        as `ctx.scheduled_at` (docs/guide/periodic.md). `name` (default the task's) tells apart
        several schedules of one task; `payload`, `queue` and `priority` are those of each job
        (default: `{}`, the task's queue and priority). `catch_up` says which slots missed while
        no worker ran are enqueued: "latest" (the last one), "all" (up to 1,000), "none".

        Every option is checked here, each a ConfigError naming it: a worker never finds out at
        run time that a schedule cannot run."""
        if (cron is None) == (every is None):
            raise ConfigError("cron", "give exactly one of cron and every")
        found = self._tasks.get(task) if isinstance(task, str) else None
        if isinstance(task, TaskHandle) and self._tasks.get(task.name) is task.task:
            found = task.task
        if found is None:
            shown = task.name if isinstance(task, TaskHandle) else task
            raise ConfigError("task", self._unknown(shown).split(". To enqueue", 1)[0])
        label = _schedule.check_name(found.name if name is None else name)
        if label in self._schedules:
            raise ConfigError(
                "name",
                f"a schedule named {label!r} is already registered; give each schedule of a "
                "task its own name=",
            )
        zone = _schedule.check_timezone(timezone)
        if every is not None and zone != "UTC":
            raise ConfigError(
                "timezone",
                f"applies to cron only, got {zone!r} with every=: `every` slots are multiples "
                "of it since the Unix epoch in UTC; for local times give a cron expression",
            )
        expression = None if cron is None else _schedule.check_cron(cron, zone)
        period = None if every is None else _schedule.check_every(every)
        policy = _schedule.check_catch_up(catch_up)
        lane = validate.name(
            "queue", queue, validate.MAX_QUEUE_LENGTH, required=False, error=ConfigError
        )
        prio = (
            found.priority
            if priority is None
            else validate.priority("priority", priority, error=ConfigError)
        )
        try:
            checked = _checked(found, {} if payload is None else payload, "payload")
            text = _payload(None, checked)
        except ValidationError as exc:
            raise ConfigError(exc.field, str(exc)[len(exc.field) + 2 :]) from None
        schedule = Schedule(
            name=label,
            task=found.name,
            cron=expression,
            every=period,
            timezone=zone,
            catch_up=policy,
            payload=text,
            queue=lane or found.queue,
            priority=prio,
            version=found.version,
        )
        self._schedules[label] = schedule
        return schedule

    def schedules(self) -> list[Schedule]:
        """The periodic schedules of this registry, by name."""
        return [self._schedules[n] for n in sorted(self._schedules)]

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

    def served(self) -> list[tuple[str, int]]:
        """Every (type, payload version) this registry runs, directly or through upgraders."""
        return [(t.name, v) for t in self._tasks.values() for v in t.versions]

    async def enqueue(
        self,
        conn: Any,
        type: str,
        payload: Any = None,
        *,
        schema: str = DEFAULT_SCHEMA,
        **options: Unpack[EnqueueOptions],
    ) -> EnqueueResult:
        """`pgworker.enqueue` with this registry's task defaults for queue, priority,
        max_retries and version (the task's payload version) where the caller gives none, and
        the payload checked as the task's handle checks it (`TaskHandle.enqueue`).

        A type this registry has no task for is refused (ValidationError naming `type`, nothing
        written): it is most often a typo, whose job would wait on `default` for a worker that
        never comes. `pgworker.enqueue(conn, type, ...)` enqueues a type served elsewhere."""
        task = self._tasks.get(type) if isinstance(type, str) else None
        if task is None:
            raise ValidationError("type", self._unknown(type))
        checked = _checked(task, payload, "payload")
        return await enqueue(conn, type, checked, schema=schema, **_with_defaults(task, options))

    def checked_json(self, type: str, payload: Any, field: str = "payload") -> Any:
        """`payload`, a JSON value sent for a job of `type` (an HTTP body's, a form's of the
        console), as that job stores it: for a typed task, checked as JSON Schema reads the
        task's payload schema (strictly: no `"5"` for an integer, what the HTTP API's document
        promises) and then by the type, a ValidationError naming the path under `field`
        (`payload.amount`); for any other type, as given."""
        task = self._tasks.get(type) if isinstance(type, str) else None
        if task is None or task.payload_type is None:
            return payload
        task.payload_type.check_json(payload, field)
        return task.payload_type.encode(payload, field)

    def schemas(self) -> dict[str, dict[str, Any]]:
        """Each task's payload JSON schema by type: pydantic's for a typed task (nested types
        under `$defs`), `{}` (any JSON value, JSON Schema's empty schema) for the others."""
        return {
            t.name: {} if t.payload_type is None else t.payload_type.json_schema()
            for t in self._tasks.values()
        }

    def _unknown(self, type: object) -> str:
        """Why `type` cannot be enqueued through this registry: its tasks (the first 20, and
        the closest names first), and the function that enqueues any type."""
        names = sorted(self._tasks)
        close: list[str] = []
        if isinstance(type, str) and len(type) <= validate.MAX_TYPE_LENGTH:
            close = difflib.get_close_matches(type, names, n=3)
        shown = [*close, *(n for n in names if n not in close)][:_SHOWN_TASKS]
        if not names:
            tasks = "this registry has no tasks"
        else:
            more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
            tasks = "this registry's tasks are " + ", ".join(map(repr, shown)) + more
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (
            f"{_shown(type)} is not a task of this registry{hint}; {tasks}. To enqueue a "
            "type this registry does not serve, use pgworker.enqueue(conn, type, ...)"
        )


def _shown(value: object, limit: int = 80) -> str:
    """`value` for a message: its repr, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _upgraders(upgrade: Any, version: int) -> dict[int, Upgrader]:
    """`upgrade` checked: versions from 1 below `version`, each mapped to a plain function,
    without gaps (each one's result is the next one's input, up to `version`)."""
    if upgrade is None:
        return {}
    if not isinstance(upgrade, Mapping):
        raise ConfigError("upgrade", f"must be a dict {{version: function}}, got {upgrade!r}")
    for v, fn in upgrade.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < version:
            raise ConfigError(
                "upgrade", f"keys must be payload versions from 1 to {version - 1}, got {v!r}"
            )
        if not callable(fn):
            raise ConfigError("upgrade", f"upgrade[{v}] must be a function, got {fn!r}")
        if inspect.iscoroutinefunction(fn):
            raise ConfigError(
                "upgrade", f"upgrade[{v}] must be a plain function (upgraders run synchronously)"
            )
    missing = [v for v in range(min(upgrade, default=version), version) if v not in upgrade]
    if missing:
        raise ConfigError(
            "upgrade",
            f"has no upgrader for version {missing[0]}: upgrade[v] turns a payload of version v "
            f"into version v + 1, each one up to version {version}",
        )
    return dict(upgrade)


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
