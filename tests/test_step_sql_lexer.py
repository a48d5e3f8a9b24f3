"""The reader behind a transactional step's connection (pgworker/_steps/connection.py): which
statements of a text control a transaction, as PostgreSQL would split and read the text. No
database: the refusals themselves are tested with real steps in test_step_escape.py."""

from __future__ import annotations

import pytest

from pgworker._steps.connection import transaction_control

REFUSED = {
    "COMMIT; BEGIN": "COMMIT",
    "commit": "COMMIT",
    "CoMmIt": "COMMIT",
    "\n\t  Commit\n": "COMMIT",
    "/* c */ COMMIT": "COMMIT",
    "/* /* nested */ still a comment */ COMMIT": "COMMIT",
    "-- c\nrollback": "ROLLBACK",
    "SELECT 1; COMMIT; BEGIN": "COMMIT",
    ";;; commit": "COMMIT",
    "(SELECT 1); rollback": "ROLLBACK",
    "end": "END",
    "abort": "ABORT",
    "START TRANSACTION": "START",
    "savepoint a": "SAVEPOINT",
    "release a": "RELEASE",
    "rollback to a": "ROLLBACK",
    "PREPARE TRANSACTION 'x'": "PREPARE TRANSACTION",
    "prepare /* c */ transaction 'x'": "PREPARE TRANSACTION",
    "commit prepared 'x'": "COMMIT",
    "rollback prepared 'x'": "ROLLBACK",
    "SELECT 'it''s'; COMMIT": "COMMIT",
    "SELECT E'\\''; COMMIT": "COMMIT",
    "SELECT $t$ ; $u$ COMMIT $t$; commit": "COMMIT",
    "SELECT x$$a$$; COMMIT": "COMMIT",
    "SELECT $1; COMMIT": "COMMIT",
    "SELECT 1 - -1; commit": "COMMIT",
    "SELECT 4/2; commit": "COMMIT",
    # standard_conforming_strings off: the backslash escapes the quote, and COMMIT is a statement
    "SELECT 'x\\''; COMMIT; BEGIN; --'": "COMMIT",
    # a routine's BEGIN ATOMIC body holds `;`s, but the statement ends after its END
    "CREATE OR REPLACE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC INSERT INTO t VALUES (1); END; "
    "COMMIT": "COMMIT",
    "create function f() returns int language sql begin atomic select ';'; end; commit": "COMMIT",
    # BEGIN not followed by ATOMIC, or inside parentheses, opens no body
    "CREATE FUNCTION f(begin atomic) RETURNS int LANGUAGE sql AS 'select 1'; COMMIT": "COMMIT",
    "CREATE FUNCTION f() RETURNS begin LANGUAGE sql AS 'select 1'; COMMIT": "COMMIT",
    "SELECT begin, atomic FROM t; end": "END",
    "CREATE TABLE t (a int); COMMIT": "COMMIT",
}

SENT = [
    "INSERT INTO t VALUES ($1)",
    "SELECT 'COMMIT; BEGIN'",
    "SELECT $$ ; COMMIT $$",
    "SELECT $t$ ; COMMIT $t$",
    "SELECT E'\\'; COMMIT; --'",
    "SELECT e'\\'; COMMIT; --'",
    'SELECT 1 AS "x;commit"',
    'SELECT 1 AS "x"";commit"',
    "-- COMMIT",
    "/* /* */ ; COMMIT */ SELECT 1",
    "SELECT CASE WHEN true THEN 1 END",
    "DO $$ BEGIN PERFORM 1; END $$",
    "PREPARE p AS SELECT 1",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; "
    "SELECT CASE WHEN true THEN 2 END; END",
    "SELECT a$commit$ FROM t",
    "SELECT 1 AS commit",
    'SELECT start, "end" FROM t',
    "commitx",
    "commit_1",
    "begin$",
    "éend",
    # unterminated: PostgreSQL refuses the whole text, nothing of it runs
    "SELECT 'unterminated; commit",
    "SELECT $$ unterminated; commit",
    "/* unterminated; commit",
]


@pytest.mark.parametrize(("sql", "keyword"), list(REFUSED.items()), ids=list(REFUSED))
def test_a_transaction_control_statement_is_found(sql, keyword):
    assert transaction_control(sql) == keyword


@pytest.mark.parametrize("sql", SENT)
def test_text_that_only_mentions_transaction_words_is_not_refused(sql):
    assert transaction_control(sql) is None


# --- BEGIN ATOMIC bodies with case and end words, comments ended by CR -----------------------


ROUTINE = "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql "


ESCAPES = {
    "attribute named case": ROUTINE + "BEGIN ATOMIC SELECT x.case FROM (SELECT 1 AS case) x; "
    "END; COMMIT",
    "label after AS": ROUTINE + "BEGIN ATOMIC SELECT 1 AS case; END; COMMIT",
    "bare label": ROUTINE + "BEGIN ATOMIC SELECT 1 case; END; COMMIT",
    "end as a label": ROUTINE + "BEGIN ATOMIC SELECT 1 AS end; END; COMMIT",
    "begin, atomic is no body": ROUTINE + "SET search_path = begin, atomic AS 'select 1'; END",
    # PostgreSQL ends a -- comment at a carriage return as at a newline
    "comment ended by CR": "SELECT 1 -- c\r; COMMIT",
    "comment ended by CR in a body": ROUTINE + "BEGIN ATOMIC SELECT 1; -- c\rEND; COMMIT",
}


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("sql", list(ESCAPES.values()), ids=list(ESCAPES))
async def test_a_commit_after_a_body_or_a_comment_is_found(sql: str) -> None:
    assert transaction_control(sql) in ("COMMIT", "END")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize(
    "sql",
    [
        ROUTINE + "BEGIN ATOMIC SELECT x.case FROM (SELECT 1 AS case) x; END",
        ROUTINE + "BEGIN /* c */ ATOMIC SELECT 1 end; END; SELECT 1",
        ROUTINE + "BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; "
        "SELECT (CASE WHEN true THEN 2 END); END; SELECT 1",
        ROUTINE + "BEGIN ATOMIC END",
        "SELECT 1 -- c; COMMIT\r\nSELECT 2",
    ],
)
async def test_a_begin_atomic_body_with_case_and_end_words_is_sent(sql: str) -> None:
    assert transaction_control(sql) is None
