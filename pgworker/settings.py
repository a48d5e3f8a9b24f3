"""Worker settings: frozen, validated once at start-up, readable from PGWORKER_* variables."""

from __future__ import annotations

import math
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import ConfigError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def dsn_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """PGWORKER_DSN, else DATABASE_URL; never libpq's defaults."""
    env = os.environ if env is None else env
    return env.get("PGWORKER_DSN") or env.get("DATABASE_URL") or None


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _positive(name: str, value: Any, *, integer: bool = False, zero: bool = False) -> None:
    kinds = int if integer else int | float
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        kind = "an int" if integer else "a number"
        raise ConfigError(name, f"must be {kind} {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Settings:
    """How a worker runs. Times are in seconds."""

    dsn: str
    concurrency: int = 10
    queues: tuple[str, ...] = ("default",)
    worker_id: str = field(default_factory=default_worker_id)
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    lease: float = 30.0
    listen: bool = True
    durable_claims: bool = False
    schema: str = "pgworker"
    code_version: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dsn, str) or not self.dsn:
            raise ConfigError(
                "dsn", "no database given; pass --dsn or set PGWORKER_DSN or DATABASE_URL"
            )
        _positive("concurrency", self.concurrency, integer=True)
        _positive("poll_interval", self.poll_interval)
        _positive("shutdown_timeout", self.shutdown_timeout, zero=True)
        _positive("lease", self.lease)
        if isinstance(self.queues, str) or not self.queues:
            raise ConfigError("queues", f"must be a non-empty list of names, got {self.queues!r}")
        object.__setattr__(self, "queues", tuple(self.queues))
        for q in self.queues:
            if not isinstance(q, str) or not q:
                raise ConfigError("queues", f"queue names must be non-empty strings, got {q!r}")
        for name in ("listen", "durable_claims"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.worker_id, str) or not self.worker_id:
            raise ConfigError("worker_id", f"must be a non-empty string, got {self.worker_id!r}")
        if not isinstance(self.schema, str) or not _IDENT.match(self.schema):
            raise ConfigError("schema", f"must be a plain SQL identifier, got {self.schema!r}")

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
            values[f.name] = _parse(f.name, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, raw: str) -> Any:
    try:
        if name == "concurrency":
            return int(raw)
        if name in ("poll_interval", "shutdown_timeout", "lease"):
            return float(raw)
    except ValueError as exc:
        raise ConfigError(name, f"PGWORKER_{name.upper()}={raw!r} is not a number") from exc
    if name == "queues":
        return tuple(q.strip() for q in raw.split(",") if q.strip())
    if name in ("listen", "durable_claims"):
        if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ConfigError(name, f"PGWORKER_{name.upper()}={raw!r} must be true or false")
        return raw.lower() in ("1", "true", "yes", "on")
    return raw
