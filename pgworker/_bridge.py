"""A transactional step's function for plain `def` handlers: a plain `fn(conn, ...)` run in a
thread with a synchronous connection, each of whose calls runs on the worker's event loop against
the step's own connection (`_steps.connection.StepConnection`, with its refusals) while the thread
waits. `block(what, make)` is the handler context's: it runs `make()` on the loop and returns its
value (see `JobContext._call`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from . import _threads

Block = Callable[[str, Callable[[], Awaitable[Any]]], Any]

_WHAT = "transactional_step"


class SyncConnection:
    """The connection a plain function of a transactional step gets: `execute`, `executemany`,
    `fetch`, `fetchrow`, `fetchval` block and return what asyncpg's return; `with
    conn.transaction():` makes a savepoint. Transaction control is refused as on the
    asynchronous one, and it refuses everything once the function has returned."""

    __slots__ = ("_block", "_conn")

    def __init__(self, conn: Any, block: Block) -> None:
        self._conn = conn
        self._block = block

    def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        return self._block(_WHAT, lambda: self._conn.execute(query, *args, **kwargs))  # type: ignore[no-any-return]

    def executemany(self, command: str, *args: Any, **kwargs: Any) -> None:
        self._block(_WHAT, lambda: self._conn.executemany(command, *args, **kwargs))

    def fetch(self, query: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self._block(_WHAT, lambda: self._conn.fetch(query, *args, **kwargs))  # type: ignore[no-any-return]

    def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return self._block(_WHAT, lambda: self._conn.fetchrow(query, *args, **kwargs))

    def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        return self._block(_WHAT, lambda: self._conn.fetchval(query, *args, **kwargs))

    @contextlib.contextmanager
    def transaction(self, **options: Any) -> Iterator[None]:
        """A savepoint inside the step's transaction (asyncpg's `conn.transaction()`): released
        when the block ends, rolled back to when it raises."""
        inner = self._conn.transaction(**options)
        self._block(_WHAT, inner.start)
        try:
            yield
        except BaseException:
            self._block(_WHAT, inner.rollback)
            raise
        self._block(_WHAT, inner.commit)

    def __repr__(self) -> str:
        return f"<SyncConnection of {self._conn!r}>"


class SyncStep:
    """A plain `fn(conn, *args, **kwargs)` of a transactional step called from a thread: awaited
    by the step as an async function would be, it runs `fn` in a thread with a SyncConnection."""

    __slots__ = ("_block", "_fn")

    def __init__(self, fn: Callable[..., Any], block: Block) -> None:
        self._fn = fn
        self._block = block

    async def __call__(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        facade = SyncConnection(conn, self._block)
        return await _threads.run(functools.partial(self._fn, facade, *args, **kwargs))

    def __repr__(self) -> str:
        return repr(self._fn)
