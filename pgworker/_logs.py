"""Structured logs: JSON lines for containers, readable console output otherwise.

Lines about a job carry job_id, attempt, correlation_id and worker_id, both on the runtime's
lines and on the handler's `ctx.log`; any structlog logger used inside a handler gets them too
through context variables. Levels below the configured one cost a no-op call.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

LogFormat = Literal["json", "console"]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def configure(fmt: LogFormat = "console", level: str = "info", stream: Any = None) -> None:
    """Configure structlog for a pgworker process (the CLI calls this; libraries embedding a
    Worker keep their own structlog configuration). Lines logged through the standard `logging`
    module (asyncpg's, Python's warnings) are rendered the same way on the same stream, their
    tracebacks inside the line, so that a JSON log stays one object per line."""
    stream = stream or sys.stderr
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tail: list[Any]
    if fmt == "json":
        tail = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        tail = [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
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
    global _base
    _base = None


def configure_logging(format: LogFormat = "console", level: str = "info") -> None:
    """Send pgworker's events (and every other structlog or `logging` line) to stderr, as
    readable lines or JSON objects, from `level` up. The CLI calls it; an application embedding
    a Worker may, or keep its own logging configuration."""
    configure(format, level)


_HANDLER = "pgworker-cli"


_base: Any = None


def base_logger() -> Any:
    """pgworker's logger, made once on first use (after the CLI has configured structlog): a
    disabled level then costs a no-op call, and binding stays a dictionary copy."""
    global _base
    if _base is None:
        _base = structlog.get_logger("pgworker").bind()
    return _base


def enabled(logger: Any, level: int) -> bool:
    """Whether `logger` emits at `level`: lets hot paths skip building a line nobody reads."""
    check = getattr(logger, "is_enabled_for", None)
    return True if check is None else check(level)


def get_logger(**bound: Any) -> Any:
    return base_logger().bind(**bound)
