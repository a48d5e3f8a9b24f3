"""Threads for plain `def` handlers (and the plain functions of steps), and what a fork in one
of them must not do: go on as a second worker."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import queue
import threading
from collections.abc import Callable
from typing import Any


class _DaemonThreads:
    """Threads for plain `def` handlers. Daemon threads, unlike anyio's: a handler that never
    returns is abandoned at shutdown (Python cannot stop a thread) and must not keep the process
    alive. Idle threads wait for the next handler."""

    def __init__(self) -> None:
        self._idle: list[queue.SimpleQueue[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            inbox.get()()
            with self._lock:
                self._idle.append(inbox)

    async def run(self, fn: Callable[[], Any]) -> Any:
        """`fn()` in a thread, with the caller's context variables; raises what it raised. A
        cancelled caller stops waiting; the thread finishes on its own."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        context = contextvars.copy_context()

        def report(outcome: tuple[bool, Any]) -> None:
            if not done.done():
                done.set_result(outcome)

        def work() -> None:
            try:
                outcome = (True, context.run(fn))
            except BaseException as exc:
                outcome = (False, exc)
            if forked:
                leave_forked_child()
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(report, outcome)

        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="pgworker-handler", daemon=True
            ).start()
        inbox.put(work)
        ok, value = await done
        if not ok:
            raise value
        return value


run = _DaemonThreads().run
"""`await run(fn)`: `fn()` in a handler thread, with the caller's context variables."""


forked = False
"""Set in a child process made by fork(); a worker starting there clears it (see `serving`). A
flag rather than os.getpid() around each handler: that is a system call per job."""


def _in_forked_child() -> None:
    global forked
    forked = True


os.register_at_fork(after_in_child=_in_forked_child)


def serving() -> None:
    """A worker starts in this process: handlers that return here run in it, not in a child."""
    global forked
    forked = False


def leave_forked_child() -> None:
    """A handler forked and its child came back here (returned, or raised: `sys.exit()`): the
    child must not go on as a second worker on the parent's connections."""
    os._exit(0)
