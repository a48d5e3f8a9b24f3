"""Worker settings: frozen, validated once at start-up, readable from PGWORKER_* variables."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from . import _validate as validate
from ._redact import DEFAULT_KEYS, shown_dsn
from .errors import ConfigError, ValidationError
from .models import DEFAULT_QUEUE, DEFAULT_SCHEMA


def dsn_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """PGWORKER_DSN, else DATABASE_URL; never libpq's defaults."""
    env = os.environ if env is None else env
    return env.get("PGWORKER_DSN") or env.get("DATABASE_URL") or None


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
KEEP_FOREVER = ("0", "none")
"""What `--retain-completed`, `--retain-failed` and their variables take to keep jobs forever."""

FLAGS = ("listen", "durable_claims", "pooler")
"""The settings read from a PGWORKER_* variable as true or false."""


def duration(field: str, raw: str, *, error: type[Exception] = ValidationError) -> float:
    """Seconds from a duration as people write it: `30s`, `15m`, `2h`, `7d`, `1w`, or a plain
    number of seconds; at most ten years."""
    found = _DURATION.fullmatch(raw.strip().lower()) if isinstance(raw, str) else None
    if found is None:
        raise error(
            field,
            f"must be a duration such as 30s, 15m, 2h, 7d or a number of seconds, got {raw!r}",
        )
    return validate.seconds(field, float(found.group(1)) * _UNITS[found.group(2)], error=error)


def retention(field: str, raw: str, *, error: type[Exception] = ConfigError) -> float | None:
    """A retention read from text: a duration, or `0` / `none` for keep forever (None)."""
    if isinstance(raw, str) and raw.strip().lower() in KEEP_FOREVER:
        return None
    age = duration(field, raw, error=error)
    return age or None


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Settings:
    """How a worker runs. Times are in seconds (a timedelta is accepted too). `queues=None`
    serves every queue the registry's tasks name, plus `default`.

    Leases: a worker extends its jobs' leases every lease/3, each heartbeat answered within
    min(lease/3, 10 s) or tried again on a new connection. A worker whose last answered
    heartbeat was sent more than 5/6 of the lease ago stops its attempts (their outcomes not
    written) and its claims before those leases can expire, until a heartbeat is answered: it
    fences itself (docs/reliability.md).

    Bounds (_validate.py): concurrency 1 to 10,000; lease > 0 up to a day; poll_interval > 0 up
    to an hour; shutdown_timeout 0 up to a day; queue names up to 63 characters, worker_id up
    to 200.

    Retention: the elected worker deletes completed jobs `retain_completed` seconds after they
    finished (default 7 days), failed and cancelled ones after `retain_failed` (default 30
    days), with their attempts, steps, milestones and events; None (or 0) keeps them forever.

    Secrets: before an error text is stored or logged, the values of payload keys whose name
    contains one of `redact_keys` (case-insensitively), URL passwords, `key=value` pairs of those
    keys and bearer tokens are replaced by `[REDACTED]` (see _redact.py). The DSN's password is
    never shown, in `repr` either.

    Health file: a path that the worker rewrites at each heartbeat with its services' health, for
    `pgworker health` (a container's probe); None writes none.

    Metrics: with `metrics_port`, the worker serves Prometheus metrics at
    http://metrics_host:metrics_port/metrics (the `metrics` extra); None serves none.

    Pooler: `pooler=True` when `dsn` reaches PostgreSQL through a transaction pooler (PgBouncer
    in transaction mode): no startup parameters, no named prepared statements, no session
    state. LISTEN then needs a direct connection, `listen_dsn`; without one the worker polls
    every `poll_interval`. Without `pooler`, `listen_dsn` (if given) is where the worker
    listens instead of `dsn`."""

    dsn: str
    concurrency: int = 10
    queues: tuple[str, ...] | None = None
    worker_id: str = field(default_factory=default_worker_id)
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    lease: float = 30.0
    listen: bool = True
    durable_claims: bool = False
    schema: str = DEFAULT_SCHEMA
    code_version: str | None = None
    retain_completed: float | None = 7 * 86400.0
    retain_failed: float | None = 30 * 86400.0
    redact_keys: tuple[str, ...] = DEFAULT_KEYS
    health_file: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    pooler: bool = False
    listen_dsn: str | None = None

    @property
    def served_queues(self) -> tuple[str, ...]:
        """The queues a started worker serves (a Worker fills `queues` in when it is None)."""
        return self.queues or (DEFAULT_QUEUE,)

    def __post_init__(self) -> None:
        if not isinstance(self.dsn, str) or not self.dsn:
            raise ConfigError(
                "dsn", "no database given; pass --dsn or set PGWORKER_DSN or DATABASE_URL"
            )
        validate.count(
            "concurrency",
            self.concurrency,
            minimum=1,
            maximum=validate.MAX_CONCURRENCY,
            error=ConfigError,
        )
        for name, maximum, zero in (
            ("poll_interval", validate.MAX_POLL_INTERVAL, False),
            ("shutdown_timeout", validate.MAX_LEASE, True),
            ("lease", validate.MAX_LEASE, False),
        ):
            value = validate.seconds(
                name, getattr(self, name), maximum=maximum, zero=zero, error=ConfigError
            )
            object.__setattr__(self, name, value)
        if self.queues is not None:
            given: object = self.queues
            if isinstance(given, str) or not self.queues:
                raise ConfigError(
                    "queues", f"must be a non-empty list of names or None, got {self.queues!r}"
                )
            object.__setattr__(self, "queues", tuple(self.queues))
            for q in self.queues:
                validate.name("queues", q, validate.MAX_QUEUE_LENGTH, error=ConfigError)
        for name in FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        listen_dsn: object = self.listen_dsn
        if listen_dsn is not None and (not isinstance(listen_dsn, str) or not listen_dsn):
            raise ConfigError(
                "listen_dsn", "must be a PostgreSQL connection URL reaching the server directly"
            )
        validate.name("worker_id", self.worker_id, validate.MAX_WORKER_ID_LENGTH, error=ConfigError)
        validate.identifier("schema", self.schema, error=ConfigError)
        validate.name(
            "code_version",
            self.code_version,
            validate.MAX_WORKER_ID_LENGTH,
            required=False,
            error=ConfigError,
        )
        for name in ("retain_completed", "retain_failed"):
            age = getattr(self, name)
            if isinstance(age, str):  # as on the command line: 7d, 12h, 0 or none
                age = retention(name, age)
            elif age is not None:
                age = validate.seconds(name, age, error=ConfigError) or None
            object.__setattr__(self, name, age)
        keys: object = self.redact_keys
        if isinstance(keys, str) or not isinstance(keys, tuple | list):
            raise ConfigError("redact_keys", f"must be a list of key names, got {keys!r}")
        for key in keys:
            validate.name("redact_keys", key, validate.MAX_QUEUE_LENGTH, error=ConfigError)
        object.__setattr__(self, "redact_keys", tuple(k.lower() for k in keys))
        health_file: object = self.health_file
        if isinstance(health_file, os.PathLike):
            health_file = os.fspath(health_file)
        health_file = validate.name(
            "health_file", health_file, validate.MAX_PATH_LENGTH, required=False, error=ConfigError
        )
        object.__setattr__(self, "health_file", health_file)
        if self.metrics_port is not None:
            validate.count(
                "metrics_port", self.metrics_port, minimum=1, maximum=65535, error=ConfigError
            )
        validate.name("metrics_host", self.metrics_host, 253, error=ConfigError)
        if any(c.isspace() or not c.isprintable() for c in self.metrics_host):
            raise ConfigError(
                "metrics_host", f"must be a host name or an IP address, got {self.metrics_host!r}"
            )

    def __repr__(self) -> str:
        """The settings, the DSN's password replaced."""
        shown = (f"{f.name}={_shown(f.name, getattr(self, f.name))}" for f in fields(self))
        return f"Settings({', '.join(shown)})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from PGWORKER_* variables (PGWORKER_CONCURRENCY, PGWORKER_QUEUES=a,b, ...),
        with `overrides` (those not None) taking precedence."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {"dsn": dsn_from_env(env)}
        for f in fields(cls):
            raw = env.get(f"PGWORKER_{f.name.upper()}")
            if raw is None or f.name == "dsn":
                continue
            if f.name in FLAGS and not raw.strip():  # `PGWORKER_POOLER=`: not set, as in the CLI
                continue
            values[f.name] = _parse(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _shown(name: str, value: Any) -> str:
    """A field's value as `repr` shows it: a DSN without its password."""
    return repr(shown_dsn(value) if name in ("dsn", "listen_dsn") and value else value)


def _parse(name: str, raw: str) -> Any:
    try:
        if name in ("concurrency", "metrics_port"):
            return validate.whole(raw.strip())
        if name in ("poll_interval", "shutdown_timeout", "lease"):
            return validate.real(raw.strip())
    except ValueError as exc:
        raise ConfigError(name, f"PGWORKER_{name.upper()}={raw!r} is not a number") from exc
    if name == "queues":
        return tuple(q.strip() for q in raw.split(",") if q.strip()) or None
    if name == "redact_keys":  # empty: no key's values are searched for
        return tuple(k.strip() for k in raw.split(",") if k.strip())
    if name == "listen_dsn":
        return raw or None
    if name in ("retain_completed", "retain_failed"):
        return retention(f"PGWORKER_{name.upper()}", raw)
    if name in FLAGS:
        return flag(name, raw)
    return raw


def flag(name: str, raw: str, default: bool = False) -> bool:
    """The value of variable PGWORKER_<NAME>, true or false (1/0, yes/no, on/off, in any case,
    spaces around ignored); empty is not set: `default`."""
    value = raw.strip().lower()
    if not value:
        return default
    if value not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ConfigError(
            name,
            f"PGWORKER_{name.upper()}={raw!r} must be true or false (1/0, yes/no, on/off), or "
            "empty for the default",
        )
    return value in ("1", "true", "yes", "on")
