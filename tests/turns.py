"""Turns on a worker's shared connection (SharedConnection), timed: who took one, how long it
waited for it, how long it held it. For tests and bench/shared_wait.py."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pgworker._db.connection import SharedConnection

SERVICES = ("completer", "heartbeat", "producer")
"""The services of pgworker/_runtime that take turns, named after their modules."""


class Turn(NamedTuple):
    borrower: str
    """completer, heartbeat, steps, producer, or maintenance.<its service's module>"""
    waited: float
    held: float


def borrower() -> str:
    """The service taking a turn: the innermost of pgworker's service modules on the stack (for
    the maintenance, `maintenance.` and the module of the service: rescue, retention, ...)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.parent.name == "_maintenance" or path.name == "leadership.py":
            return f"maintenance.{path.stem}"
        if path.parent.name == "_steps" or path.name == "_steps.py":
            return "steps"
        if path.parent.name == "_runtime" and path.stem in SERVICES:
            return path.stem
        frame = frame.f_back  # type: ignore[assignment]
    return "other"


@contextlib.contextmanager
def timed_turns() -> Iterator[list[Turn]]:
    """Every turn taken on a shared connection while the block runs."""
    turns: list[Turn] = []
    real = SharedConnection.acquire

    @contextlib.asynccontextmanager
    async def timed(self: SharedConnection) -> AsyncIterator[Any]:
        who = borrower()
        asked = time.perf_counter()
        async with real(self) as conn:
            got = time.perf_counter()
            try:
                yield conn
            finally:
                turns.append(Turn(who, got - asked, time.perf_counter() - got))

    SharedConnection.acquire = timed  # type: ignore[method-assign]
    try:
        yield turns
    finally:
        SharedConnection.acquire = real  # type: ignore[method-assign]
