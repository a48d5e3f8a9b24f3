"""`migrate` drops the pooled functions of older releases that no registered worker calls: each
worker says which it calls (workers.functions), and while one does not say (a release before
migration 27), none is dropped."""

from __future__ import annotations

from typing import Any

import pytest

import pgworker
from pgworker._db.queries import queries

from .helpers import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

OLD = "_pooled_job_claim_0123456789ab"
"""A function of an older release's statement text, which no worker calls."""

KEPT = "_pooled_worker_heartbeat_ba9876543210"
"""A function of another release, which a registered worker says it calls."""


async def pooled(conn: Any) -> set[str]:
    rows = await conn.fetch(
        "SELECT p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'pgworker' AND p.proname LIKE '\\_pooled\\_%'"
    )
    return {r["proname"] for r in rows}


async def make_old(conn: Any, *names: str) -> None:
    for name in names:
        await conn.execute(
            f"CREATE FUNCTION pgworker.{name}(integer, text) RETURNS integer "
            "LANGUAGE sql AS 'SELECT 1'"
        )


async def register(conn: Any, worker_id: str, functions: list[str] | None, http: bool = False):
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency, "
        "functions, http) VALUES ($1, 'h', 1, '{default}', '{t}', 1, $2, $3)",
        worker_id,
        functions,
        http,
    )


@pytest.mark.parametrize("pooler", [False, True], ids=["direct", "pooler"])
async def test_migrate_drops_the_functions_no_worker_calls_and_keeps_the_others(
    conn: Any, pooler: bool
) -> None:
    current = set(queries("pgworker")._pooled_names())
    assert await queries("pgworker").pooled_functions(conn) == []
    await make_old(conn, OLD, KEPT)
    await register(conn, "other-release", [KEPT])
    await register(conn, "direct", [])
    await register(conn, "http", None, http=True)  # an HTTP worker calls none, says none
    assert await pgworker.migrate(conn, pooler=pooler) == []
    assert await pooled(conn) == current | {KEPT}
    await conn.execute("DELETE FROM pgworker.workers WHERE worker_id = 'other-release'")
    await pgworker.migrate(conn, pooler=pooler)
    assert await pooled(conn) == current


async def test_while_a_worker_does_not_say_which_it_calls_none_is_dropped(conn: Any) -> None:
    await make_old(conn, OLD)
    await register(conn, "before-27", None)
    await pgworker.migrate(conn)
    assert OLD in await pooled(conn)
    await conn.execute("DELETE FROM pgworker.workers WHERE worker_id = 'before-27'")
    await pgworker.migrate(conn)
    assert OLD not in await pooled(conn)


@pytest.mark.parametrize("pooler", [False, True], ids=["direct", "pooler"])
async def test_a_worker_registers_the_functions_it_calls(dsn: str, conn: Any, pooler: bool) -> None:
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: Any, payload: Any) -> None:
        pass

    async with pgworker.Worker(registry, dsn, pooler=pooler, worker_id="w", poll_interval=0.05):
        row = await wait_for(
            lambda: conn.fetchrow("SELECT functions FROM pgworker.workers WHERE worker_id = 'w'")
        )
        expected = set(queries("pgworker")._pooled_names()) if pooler else set()
        assert set(row["functions"]) == expected
        if pooler:
            await make_old(conn, OLD)
            await pgworker.migrate(conn)
            assert await pooled(conn) == expected
