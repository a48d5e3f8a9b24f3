"""pgworker's logs: where its structured events go, and the CLI's configuration of them.

Where the events go follows the convention of Python libraries. Each logger is routed when it is
made (`get_logger`, called by the Worker's parts when the Worker is made and by an attempt the
first time its `ctx.log` is used; the executor asks `base_logger()` once per job), so nothing
about the choice is kept between workers, or between tests:

- The application configured structlog (`structlog.is_configured()`: its own
  `structlog.configure`, `pgworker.configure_logging`, the CLI, or a
  `structlog.testing.capture_logs` block): through structlog's configured pipeline, under the
  name ``pgworker``, as any structlog logger of the application.
- Otherwise: through the standard `logging` logger ``pgworker``, respecting the application's
  handlers and levels. The event text is the record's message (``job completed``); the fields
  (job_id, attempt, correlation_id, worker_id, type, error, ..., and the structlog context
  variables bound around the job) are attributes of the LogRecord (``record.job_id``). A field
  named like a LogRecord attribute (``name``, ``module``, ...) gets a trailing underscore. pgworker
  adds no handler and demotes no level (but asyncpg's pool floor warnings, DEBUG while a worker
  runs: it says itself that the database is unreachable, see _runtime/service.py): with nothing
  configured, Python's last-resort handler prints WARNING and above (a lost connection, a result
  that cannot be stored) as bare messages on stderr, and nothing per job.

Levels: one INFO line per attempt's end (``job completed``, ``job retried``, ``job failed``, ...);
``job started`` is DEBUG. Hot paths ask `enabled(logger, level)` before
building a line: for a `logging` logger that is `Logger.isEnabledFor`, which caches its answer
per level until the levels change; for structlog's filtering loggers a comparison.

Tests: `capture_logs` sets `structlog.is_configured()` and replaces the configured processors
in place, so a Worker made inside the block logs through structlog and its events are the
captured entries that `tests.helpers.logged` reads. `capture_logs` leaves structlog marked as
configured when it ends: tests of the `logging` route reset structlog's configuration first
(tests/test_logging.py restores it after).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal, TextIO

import structlog

from ._terminal import cell, terminal
from .errors import ConfigError

LogFormat = Literal["json", "console"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

LOGGER_NAME = "pgworker"

_HANDLER = "pgworker-cli"


def configure(
    fmt: LogFormat = "console", level: str = "info", stream: TextIO | None = None
) -> None:
    """Configure structlog for a pgworker process (the CLI calls this; libraries embedding a
    Worker keep their own structlog configuration). Lines logged through the standard `logging`
    module (asyncpg's, Python's warnings) are rendered the same way on the same stream, their
    tracebacks inside the line, so that a JSON log stays one object per line."""
    out = stream or sys.stderr
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tail: list[Any]
    if fmt == "json":
        tail = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # Plain tracebacks: structlog's default (rich, when installed) prints every frame's
        # locals, and those hold bearer tokens, DSNs and payloads.
        tail = [
            _Terminal(
                structlog.dev.ConsoleRenderer(
                    colors=False, exception_formatter=structlog.dev.plain_traceback
                )
            )
        ]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    logging.captureWarnings(True)
    global _configured
    _configured = None


class _Terminal:
    """A console renderer whose lines are safe on a terminal: the event's text stays on its
    line (its newlines shown as `\\n`; the renderer quotes other fields with whitespace as
    repr does), and nothing in the line is obeyed by the terminal: a handler's error text, a
    job's type or a traceback's message has its control characters shown escaped (see
    `_terminal.terminal`; a traceback keeps its own lines). The JSON format needs none of it:
    JSON escapes every control character."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        event = event_dict.get("event")
        if isinstance(event, str):
            event_dict["event"] = cell(event)
        return terminal(self._renderer(logger, method, event_dict))


def configure_logging(format: LogFormat = "console", level: str = "info") -> None:
    """Send pgworker's events (and every other structlog or `logging` line of the process) to
    stderr from `level` up (debug, info, warning or error), as readable lines (`console`) or one
    JSON object per line (`json`). The CLI calls it. An application embedding a Worker need not:
    without it, pgworker's events go to the standard `logging` logger ``pgworker`` (or through
    structlog, when the application configured structlog)."""
    if format not in ("json", "console"):
        raise ConfigError("format", f"must be 'json' or 'console', got {format!r}")
    if not isinstance(level, str) or level.lower() not in LEVELS:
        raise ConfigError("level", f"must be one of {', '.join(LEVELS)}, got {level!r}")
    configure(format, level.lower())


# --- the `logging` route -------------------------------------------------------------------

_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_LOGGING_KEYWORDS = ("exc_info", "stack_info")


def _to_record(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The last processor of the `logging` route: the event as the message (with the positional
    arguments of `log.info("%s", x)`), exc_info and stack_info as `logging`'s own arguments, the
    other fields as the record's attributes."""
    message = event_dict.pop("event", "")
    args = event_dict.pop("positional_args", ())
    keywords = {k: event_dict.pop(k) for k in _LOGGING_KEYWORDS if k in event_dict}
    if _RECORD_ATTRIBUTES.isdisjoint(event_dict):
        keywords["extra"] = event_dict
    else:
        keywords["extra"] = {
            (f"{k}_" if k in _RECORD_ATTRIBUTES else k): v for k, v in event_dict.items()
        }
    return (message, *args), keywords


_stdlib: Any = structlog.stdlib.BoundLogger(
    logging.getLogger(LOGGER_NAME),
    processors=[
        structlog.stdlib.filter_by_level,
        structlog.contextvars.merge_contextvars,
        _to_record,
    ],
    context={},
)


# --- the structlog route -------------------------------------------------------------------

_configured: tuple[Any, Any, Any, Any, Any] | None = None
"""The structlog route's logger and the configuration it was made from (processors list,
wrapper class, logger factory, context class): made again when the configuration is replaced.
`capture_logs` changes the processors list in place, which the logger sees."""


def _structlog_logger() -> Any:
    global _configured
    config = structlog.get_config()
    made = _configured
    if (
        made is None
        or made[1] is not config["processors"]
        or made[2] is not config["wrapper_class"]
        or made[3] is not config["logger_factory"]
        or made[4] is not config["context_class"]
    ):
        logger = structlog.get_logger(LOGGER_NAME).bind()
        made = _configured = (
            logger,
            config["processors"],
            config["wrapper_class"],
            config["logger_factory"],
            config["context_class"],
        )
    return made[0]


def base_logger() -> Any:
    """pgworker's logger, routed now (see the module's docstring): a structlog bound logger
    either way, so `bind`, `info(event, **fields)` and the rest work the same."""
    if structlog.is_configured():
        return _structlog_logger()
    return _stdlib


def enabled(logger: Any, level: int) -> bool:
    """Whether `logger` emits at `level`: lets hot paths skip building a line nobody reads."""
    check = getattr(logger, "is_enabled_for", None)
    return True if check is None else bool(check(level))


def get_logger(**bound: Any) -> Any:
    return base_logger().bind(**bound)
