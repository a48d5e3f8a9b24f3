"""Worker settings: frozen, validated once at start-up, readable from PGWORKER_* variables."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal, TypedDict

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

SettingKind = Literal["int", "seconds", "text", "url", "names", "keys", "flag", "retention"]
"""How a setting is read from text (its PGWORKER_* variable and its flag of `pgworker run`): a
whole number, seconds, text, a connection URL, names (a variable holds them comma-separated, a
flag is repeated; empty: the default), key names (comma-separated; empty: none), true or false,
a retention (a duration, or 0 / none for forever)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How one worker setting is given, declared with its field of Settings: the keyword of
    `Worker(...)` and of Settings, the variable `PGWORKER_<NAME>`, and the flag of `pgworker run`
    (`--<name>`, or `flag`; None: none, `why` says why; `common`: every command takes it, not
    only run). `help` says what it does and `default` what it is when not given; `flag_help`
    replaces `help` on the command line for a flag that turns a setting off (`--no-listen`)."""

    kind: SettingKind
    help: str
    default: str
    flag: str | None = ""
    why: str = ""
    common: bool = False
    metavar: str | None = None
    flag_help: str = ""

    @staticmethod
    def of(f: Field[Any]) -> Setting:
        found: Setting = f.metadata["setting"]
        return found


def _setting(kind: SettingKind, help: str, default: str, **more: Any) -> dict[str, Setting]:
    """A field's metadata: its Setting."""
    return {"setting": Setting(kind, help, default, **more)}


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

    dsn: str = field(
        metadata=_setting(
            "url",
            "the PostgreSQL connection URL, e.g. postgresql://app@db:5432/app",
            "$DATABASE_URL; required if neither is set",
            common=True,
        )
    )
    concurrency: int = field(
        default=10,
        metadata=_setting("int", f"jobs run at once, 1 to {validate.MAX_CONCURRENCY:,}", "10"),
    )
    queues: tuple[str, ...] | None = field(
        default=None,
        metadata=_setting(
            "names",
            "a queue to serve; repeat for several",
            "every queue the registry's tasks name, plus default",
            flag="--queue",
        ),
    )
    worker_id: str = field(
        default_factory=default_worker_id,
        metadata=_setting(
            "text",
            "this worker's name in `pgworker status` and the logs, at most "
            f"{validate.MAX_WORKER_ID_LENGTH} characters",
            "host-pid-random",
        ),
    )
    poll_interval: float = field(
        default=1.0,
        metadata=_setting(
            "seconds",
            "seconds between polls when no notification arrives, more than 0 and at most "
            f"{validate.MAX_POLL_INTERVAL:g}",
            "1",
        ),
    )
    shutdown_timeout: float = field(
        default=30.0,
        metadata=_setting(
            "seconds",
            f"seconds running jobs get to finish after SIGTERM, 0 to {validate.MAX_LEASE:g}",
            "30",
        ),
    )
    lease: float = field(
        default=30.0,
        metadata=_setting(
            "seconds",
            "seconds a claimed job is held without a heartbeat, more than 0 and at most "
            f"{validate.MAX_LEASE:g}",
            "30",
        ),
    )
    listen: bool = field(
        default=True,
        metadata=_setting(
            "flag",
            "LISTEN/NOTIFY wake-ups and cancel requests",
            "on",
            flag="--no-listen",
            flag_help="poll only, without LISTEN/NOTIFY",
        ),
    )
    durable_claims: bool = field(
        default=False,
        metadata=_setting(
            "flag", "claims wait for their WAL flush, see the guide, Workers: Fast claims", "off"
        ),
    )
    schema: str = field(
        default=DEFAULT_SCHEMA,
        metadata=_setting(
            "text",
            "pgworker's schema, a plain SQL identifier",
            DEFAULT_SCHEMA,
            common=True,
        ),
    )
    code_version: str | None = field(
        default=None,
        metadata=_setting(
            "text",
            "the version of the code this worker runs (a release, a commit), recorded on each "
            f"attempt, at most {validate.MAX_WORKER_ID_LENGTH} characters",
            "none",
        ),
    )
    retain_completed: float | None = field(
        default=7 * 86400.0,
        metadata=_setting(
            "retention",
            "delete completed jobs this long after they finished, e.g. 12h, 7d, 4w; 0 or none "
            "keeps them forever",
            "7d",
        ),
    )
    retain_failed: float | None = field(
        default=30 * 86400.0,
        metadata=_setting(
            "retention",
            "delete failed and cancelled jobs this long after they finished; 0 or none keeps "
            "them forever",
            "30d",
        ),
    )
    redact_keys: tuple[str, ...] = field(
        default=DEFAULT_KEYS,
        metadata=_setting(
            "keys",
            "payload keys whose values are kept out of errors and logs, comma-separated (empty: "
            "none)",
            ", ".join(DEFAULT_KEYS),
            flag=None,
            why="the commands that show jobs (show, jobs, failed) redact by them too: one "
            "variable for all, so that run and show cannot disagree",
        ),
    )
    health_file: str | None = field(
        default=None,
        metadata=_setting(
            "text",
            "rewrite this file at each heartbeat with the services' health, for `pgworker health`",
            "none",
            metavar="PATH",
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=_setting(
            "int",
            "serve Prometheus metrics at http://HOST:PORT/metrics, port 1 to 65535; needs the "
            "metrics extra",
            "no metrics",
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=_setting(
            "text", "the address the metrics server listens on, 0.0.0.0 in a container", "127.0.0.1"
        ),
    )
    pooler: bool = field(
        default=False,
        metadata=_setting(
            "flag",
            "the DSN reaches PostgreSQL through a transaction pooler such as PgBouncer: no "
            "startup parameters, prepared statements or session locks",
            "off",
            common=True,
        ),
    )
    listen_dsn: str | None = field(
        default=None,
        metadata=_setting(
            "url",
            "LISTEN on this connection URL, which reaches PostgreSQL directly, with --pooler: "
            "without it a pooler worker polls every --poll-interval",
            "--dsn, or no LISTEN with --pooler",
        ),
    )

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
            raw = env.get(variable(f.name))
            if raw is None or f.name == "dsn":
                continue
            if f.name in FLAGS and not raw.strip():  # `PGWORKER_POOLER=`: not set, as in the CLI
                continue
            values[f.name] = _parse(f.name, Setting.of(f).kind, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


SETTINGS: Mapping[str, Setting] = MappingProxyType(
    {f.name: Setting.of(f) for f in fields(Settings)}
)
"""Each setting's Setting (how it is given), by name, in the order of Settings."""
FLAGS = tuple(name for name, s in SETTINGS.items() if s.kind == "flag")
"""The settings read from a PGWORKER_* variable as true or false."""


class WorkerOptions(TypedDict, total=False):
    """The keyword options of `Worker(...)` but those it names (dsn, concurrency, queues): the
    fields of Settings, of the same types (tests/test_options.py keeps them so)."""

    worker_id: str
    poll_interval: float
    shutdown_timeout: float
    lease: float
    listen: bool
    durable_claims: bool
    schema: str
    code_version: str | None
    retain_completed: float | None
    retain_failed: float | None
    redact_keys: tuple[str, ...]
    health_file: str | None
    metrics_port: int | None
    metrics_host: str
    pooler: bool
    listen_dsn: str | None


def variable(name: str) -> str:
    """The environment variable of setting `name`: PGWORKER_<NAME>."""
    return f"PGWORKER_{name.upper()}"


def _shown(name: str, value: Any) -> str:
    """A field's value as `repr` shows it: a DSN without its password."""
    return repr(shown_dsn(value) if name in ("dsn", "listen_dsn") and value else value)


def _parse(name: str, kind: SettingKind, raw: str) -> Any:
    """A setting's value from the text of its variable."""
    try:
        if kind == "int":
            return validate.whole(raw.strip())
        if kind == "seconds":
            return validate.real(raw.strip())
    except ValueError as exc:
        raise ConfigError(name, f"{variable(name)}={raw!r} is not a number") from exc
    if kind == "names":  # empty: the default
        return tuple(q.strip() for q in raw.split(",") if q.strip()) or None
    if kind == "keys":  # empty: no key's values are searched for
        return tuple(k.strip() for k in raw.split(",") if k.strip())
    if kind == "url":
        return raw or None
    if kind == "retention":
        return retention(variable(name), raw)
    if kind == "flag":
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
