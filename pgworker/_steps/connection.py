"""The connection a transactional step's function gets: its own asyncpg connection, which refuses
transaction control before it reaches the server.

A step's effect and its checkpoint must commit together. A function that sent `COMMIT; BEGIN`
would commit its effect alone (and a retry would do it again); `ROLLBACK; BEGIN` would drop the
effect while the checkpoint says it happened. Checking afterwards is too late for the first
(the effect has committed), so every statement the function sends is read first and refused if
it ends, starts or edits a transaction or a savepoint: COMMIT/END, ROLLBACK/ABORT (with TO
SAVEPOINT and PREPARED), BEGIN/START TRANSACTION, SAVEPOINT, RELEASE, PREPARE TRANSACTION, in any
letter case, after comments, or anywhere in a multi-statement string. `transaction_control` is
a small lexer that knows where PostgreSQL does not split a text: '…' strings (E'', doubled
quotes, and backslash escapes when read as standard_conforming_strings = off), "…" identifiers,
$tag$…$tag$ dollar quotes, -- and nested /* */ comments, and the `BEGIN ATOMIC … END` body of CREATE
FUNCTION/PROCEDURE (whose statements are read as any others, see `_routine`).

Why a proxy and not a pool `connection_class`: a transactional step also runs on connections
pgworker did not open (`pgworker.testing.run_job(conn=...)`, `drain(conn)`), and a proxy guards
them all the same. It is a `PoolConnectionProxy`, as the function got before, so
`isinstance(conn, asyncpg.Connection)` holds and `pgworker.enqueue(conn, ...)` accepts it. Only
the methods that send SQL text are checked; `conn.transaction()` is asyncpg's own, bound to the
connection underneath, so its BEGIN/SAVEPOINT/RELEASE pass and a nested `async with
conn.transaction()` makes a savepoint as usual. The proxy is detached when the function returns:
kept and used later, it raises instead of writing outside the step.

The lexer is not the only guard: the step records its transaction's id before the function runs
and writes its checkpoint only if it is unchanged (see `Steps.transactional_step`), which catches
what no lexer sees (the connection underneath reached by its private attributes, a future asyncpg
method that sends SQL). A procedure or DO block that commits is refused by PostgreSQL itself
inside a transaction block ("invalid transaction termination")."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ..errors import ValidationError

_START = r"A-Za-z_\x80-\U0010ffff"
_TAG_PART = _START + r"0-9"
_PART = _TAG_PART + "$"
_CONTROL = frozenset(
    ("abort", "begin", "commit", "end", "rollback", "savepoint", "release", "start")
)
"""The first words of the statements refused; and PREPARE TRANSACTION."""
_FIRST_WORDS = (*_CONTROL, "prepare")

_SPACE = re.compile(r"\s*")
_WORD = re.compile(rf"[{_START}][{_PART}]*")
_NEXT = re.compile(r"""[;'"$]|--|/\*""")
"""Where a statement's text can stop being plain: its end, a quote, a comment."""
_STRING = re.compile(r"'(?:[^']|'')*(?:'|\Z)")
_STRING_ESCAPED = re.compile(r"'(?:[^'\\]|\\.|'')*(?:'|\Z)", re.DOTALL)
_IDENTIFIER = re.compile(r'"(?:[^"]|"")*(?:"|\Z)')
_DOLLAR = re.compile(rf"\$(?:[{_START}][{_TAG_PART}]*)?\$")
_IDENTIFIER_CHAR = re.compile(rf"[{_PART}]")
_COMMENT_EDGE = re.compile(r"/\*|\*/")
_LINE_END = re.compile(r"[\n\r]")
_TOKEN = re.compile(rf"""[;()]|[{_START}][{_PART}]*|[^;()'"$\-/{_START}]+|.""", re.DOTALL)


_CACHED_LENGTH = 4096
"""Texts up to this length have their reading cached (a step's SQL is mostly the same few
strings, its values sent apart); longer ones are read each time."""


def transaction_control(sql: str) -> str | None:
    """The first statement of `sql` that controls a transaction or a savepoint, as its leading
    word(s) in capitals (`COMMIT`, `PREPARE TRANSACTION`), or None when there is none."""
    return _read_cached(sql) if len(sql) <= _CACHED_LENGTH else _read(sql)


def _read(sql: str) -> str | None:
    """Read twice when the text has a backslash: as PostgreSQL reads it with
    standard_conforming_strings on (the default) and off; refused if either reading finds one."""
    lower = sql.lower()
    if not any(word in lower for word in _FIRST_WORDS):
        return None  # most statements: no word a transaction control starts with
    found = _scan(sql, standard=True)
    if found is None and "\\" in sql:
        found = _scan(sql, standard=False)
    return found


_read_cached = functools.lru_cache(maxsize=1024)(_read)


def _scan(sql: str, *, standard: bool) -> str | None:
    """Statement by statement: the first word of each (the second after PREPARE), the rest of
    it skipped quote by quote to the `;` that ends it."""
    pos, end = 0, len(sql)
    while pos < end:
        pos = _blank_end(sql, pos)
        first = _WORD.match(sql, pos)
        if first is None:
            pos = _statement_end(sql, pos, standard)
            continue
        found = _control(sql, first)
        if found is not None:
            return found
        if first.group().lower() == "create" and _creates_a_routine(sql, first.end()):
            pos, found = _routine(sql, first.end(), standard)
            if found is not None:
                return found
        else:
            pos = _statement_end(sql, first.end(), standard)
    return None


def _control(sql: str, first: re.Match[str]) -> str | None:
    """The transaction control a statement whose first word is `first` is, or None."""
    word = first.group().lower()
    if word in _CONTROL:
        return word.upper()
    if word == "prepare":
        second = _WORD.match(sql, _blank_end(sql, first.end()))
        if second is not None and second.group().lower() == "transaction":
            return "PREPARE TRANSACTION"
    return None


def _blank_end(sql: str, pos: int) -> int:
    """Past the white space and comments at `pos`."""
    while True:
        pos = _SPACE.match(sql, pos).end()  # type: ignore[union-attr]  # matches ""
        if sql.startswith("--", pos):
            pos = _line_end(sql, pos)
        elif sql.startswith("/*", pos):
            pos = _comment_end(sql, pos + 2)
        else:
            return pos


def _statement_end(sql: str, pos: int, standard: bool) -> int:
    """Past the `;` that ends the statement `pos` is in (or the end of the text)."""
    while True:
        m = _NEXT.search(sql, pos)
        if m is None:
            return len(sql)
        if m.group() == ";":
            return m.end()
        pos = _quoted_end(sql, m.start(), standard)


def _quoted_end(sql: str, pos: int, standard: bool) -> int:
    """Past the string, quoted identifier, dollar quote or comment that starts at `pos`, or
    one character on where what looked like one is not (a `$` inside a word, `$1`)."""
    c = sql[pos]
    if c == "'":
        escaped = not standard or (
            pos > 0
            and sql[pos - 1] in "eE"
            and (pos < 2 or _IDENTIFIER_CHAR.match(sql, pos - 2) is None)
        )
        m = (_STRING_ESCAPED if escaped else _STRING).match(sql, pos)
    elif c == '"':
        m = _IDENTIFIER.match(sql, pos)
    elif c == "$":
        if pos > 0 and _IDENTIFIER_CHAR.match(sql, pos - 1) is not None:
            return pos + 1  # inside a word: `a$b`
        m = _DOLLAR.match(sql, pos)
        if m is None:
            return pos + 1  # a parameter: `$1`
        close = sql.find(m.group(), m.end())
        return len(sql) if close < 0 else close + len(m.group())
    elif sql.startswith("--", pos):
        return _line_end(sql, pos)
    else:
        return _comment_end(sql, pos + 2)
    assert m is not None  # each pattern matches from its quote to the end
    return m.end()


def _creates_a_routine(sql: str, pos: int) -> bool:
    """Whether the CREATE statement whose first word ends at `pos` is CREATE [OR REPLACE]
    FUNCTION or PROCEDURE, whose `BEGIN ATOMIC … END` body holds `;`s."""
    words = []
    for _ in range(3):
        m = _WORD.match(sql, _blank_end(sql, pos))
        if m is None:
            break
        words.append(m.group().lower())
        pos = m.end()
    return words[:1] in (["function"], ["procedure"]) or (
        words[:2] == ["or", "replace"] and words[2:3] in (["function"], ["procedure"])
    )


def _routine(sql: str, pos: int, standard: bool) -> tuple[int, str | None]:
    """The CREATE FUNCTION/PROCEDURE statement whose first word ends at `pos`: past the `;` that
    ends it, and the first transaction control among the statements of its `BEGIN ATOMIC … END`
    body. The body opens at BEGIN ATOMIC (two words, nothing but blanks and comments between,
    outside parentheses) and its statements are read as any others; it closes at the first of
    them that begins with END, as no statement of a body can (CASE … END and parentheses never
    span a `;`). psql counts CASEs and ENDs instead, which `x.case`, `1 AS end` or a bare label
    miscount: then a COMMIT after the body would pass for part of it."""
    parens = 0
    previous = ""
    end = len(sql)
    while pos < end:
        m = _TOKEN.match(sql, pos)
        assert m is not None  # `.` matches any character
        token = m.group()
        if token in ("'", '"', "$", "-", "/") and (token not in "-/" or _NEXT.match(sql, pos)):
            pos = _quoted_end(sql, pos, standard)
            if token not in "-/":  # a comment separates words as a blank does
                previous = ""
            continue
        pos = m.end()
        if token == ";":
            return pos, None
        if token == "(":
            parens += 1
        elif token == ")":
            parens = max(parens - 1, 0)
        elif parens == 0 and previous == "begin" and token.lower() == "atomic":
            return _body(sql, pos, standard)
        if not token.isspace():
            previous = token.lower()
    return end, None


def _body(sql: str, pos: int, standard: bool) -> tuple[int, str | None]:
    """From just after BEGIN ATOMIC: past the `;` that ends the routine's statement, and the
    first transaction control among the body's statements (None when there is none)."""
    end = len(sql)
    while pos < end:
        pos = _blank_end(sql, pos)
        first = _WORD.match(sql, pos)
        if first is None:
            pos = _statement_end(sql, pos, standard)
            continue
        if first.group().lower() == "end":
            return _statement_end(sql, first.end(), standard), None
        found = _control(sql, first)
        if found is not None:
            return pos, found
        pos = _statement_end(sql, first.end(), standard)
    return end, None


def _line_end(sql: str, pos: int) -> int:
    """Past the -- comment at `pos`: PostgreSQL ends it at a carriage return as at a newline."""
    m = _LINE_END.search(sql, pos)
    return len(sql) if m is None else m.end()


def _comment_end(sql: str, pos: int) -> int:
    """Past the /* comment opened just before `pos` (they nest)."""
    depth = 1
    while depth:
        m = _COMMENT_EDGE.search(sql, pos)
        if m is None:
            return len(sql)
        depth += 1 if m.group() == "/*" else -1
        pos = m.end()
    return pos


class StepConnection(PoolConnectionProxy):
    """A transactional step's connection, while its function runs."""

    __slots__ = ("_fn", "_pooler", "_step", "refused")

    def __init__(
        self, conn: Any, step: str, fn: Callable[..., Any], *, pooler: bool = False
    ) -> None:
        # Not PoolConnectionProxy.__init__: the connection underneath stays the pool's.
        self._con = conn
        self._holder = None  # type: ignore[assignment]  # not the pool's to release
        self._step = step
        self._fn = fn
        self._pooler = pooler
        self.refused: ValidationError | None = None
        """The first refusal, kept for the step to raise should the function swallow it."""

    def detach(self) -> None:
        """The function returned: from now on this connection refuses everything."""
        self._con = None

    def _check(self, sql: Any, method: str) -> None:
        if self._con is None:
            raise asyncpg.InterfaceError(
                f"conn.{method}(): the connection of transactional step {self._step!r} was used "
                "after its function returned; write inside the function, before it returns"
            )
        if not isinstance(sql, str):
            return  # asyncpg refuses it
        control = transaction_control(sql)
        if control is not None:
            self._refuse(f"sent {control} (conn.{method}())")

    def _named(self, method: str) -> None:
        """In pooler mode, refuse what prepares a statement by name: it would stay on the server
        session after the step, where the pooler's next client meets it (its own statement of
        the same name fails)."""
        if self._pooler:
            self._refuse(
                f"called conn.{method}(), which prepares a named statement",
                "through a transaction pooler (pooler mode) it would stay on the server session "
                "that other clients get next, and break theirs of the same name",
                "use conn.fetch(), fetchrow(), fetchval() or execute(), whose statements are "
                "unnamed, and copy_to_table() rather than copy_records_to_table()",
            )

    def _refuse(self, what: str, why: str = "", fix: str = "") -> None:
        why = why or (
            "which would end or change the step's transaction so that its writes and its "
            "checkpoint could no longer commit together"
        )
        fix = fix or "for a savepoint, use `async with conn.transaction()` inside the function"
        refused = ValidationError(
            "fn",
            f"transactional step {self._step!r}: {self._fn!r} {what}, {why}; it was not sent, "
            f"the step's transaction is rolled back and the step is not recorded ({fix})",
        )
        if self.refused is None:
            self.refused = refused
        raise refused

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        self._check(query, "execute")
        return await super().execute(query, *args, **kwargs)

    async def executemany(self, command: str, *args: Any, **kwargs: Any) -> None:
        self._check(command, "executemany")
        await super().executemany(command, *args, **kwargs)

    async def fetch(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "fetch")
        return await super().fetch(query, *args, **kwargs)

    async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "fetchrow")
        return await super().fetchrow(query, *args, **kwargs)

    async def fetchval(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "fetchval")
        return await super().fetchval(query, *args, **kwargs)

    async def fetchmany(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "fetchmany")
        return await super().fetchmany(query, *args, **kwargs)

    async def prepare(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "prepare")
        self._named("prepare")
        return await super().prepare(query, *args, **kwargs)

    def cursor(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "cursor")
        self._named("cursor")
        return super().cursor(query, *args, **kwargs)

    async def copy_from_query(self, query: str, *args: Any, **kwargs: Any) -> Any:
        self._check(query, "copy_from_query")
        return await super().copy_from_query(query, *args, **kwargs)

    async def copy_to_table(self, table_name: str, *args: Any, **kwargs: Any) -> Any:
        self._check(kwargs.get("where") or "", "copy_to_table")
        return await super().copy_to_table(table_name, *args, **kwargs)

    async def copy_records_to_table(self, table_name: str, *args: Any, **kwargs: Any) -> Any:
        self._check(kwargs.get("where") or "", "copy_records_to_table")
        self._named("copy_records_to_table")
        return await super().copy_records_to_table(table_name, *args, **kwargs)

    async def reset(self, *args: Any, **kwargs: Any) -> None:
        self._check("", "reset")
        self._refuse("called conn.reset() (which sends ROLLBACK)")

    async def close(self, *args: Any, **kwargs: Any) -> None:
        self._check("", "close")
        self._refuse("called conn.close()")

    def terminate(self) -> None:
        self._check("", "terminate")
        self._refuse("called conn.terminate()")
