"""migrate: create or upgrade the schema."""

from __future__ import annotations

import argparse

from ..operations import migrate
from ._common import _command, _connect, _Parser, _pooler, _schema, say


def add(sub: argparse._SubParsersAction[_Parser], common: _Parser) -> None:
    cmd = _command(
        sub,
        "migrate",
        [common],
        "create or upgrade the schema",
        "Create or upgrade pgworker's schema (the numbered migrations in sql/migrations, each "
        "once), and drop the pooled functions of older releases that no registered worker "
        "calls; safe to run concurrently, e.g. from every container at start-up.",
        [
            "pgworker migrate --dsn postgresql://app@localhost/app",
            "PGWORKER_SCHEMA=jobs pgworker migrate     # in schema `jobs`",
            "pgworker migrate --pooler --dsn postgresql://app@pgbouncer:6432/app",
        ],
    )
    cmd.set_defaults(perform=_migrate)


async def _migrate(args: argparse.Namespace) -> int:
    conn = await _connect(args)
    try:
        applied = await migrate(conn, schema=_schema(args), pooler=_pooler(args))
    finally:
        await conn.close()
    say(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0
