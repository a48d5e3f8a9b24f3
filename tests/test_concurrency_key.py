"""`concurrency_key` at enqueue, against the real PostgreSQL: every way in
stores it (enqueue, enqueue_many's COPY and INSERT, a task's handle, the registry, pgworker.sync,
psycopg, the CLI, HTTP, the SQL function by name and by position); every place that shows a job
shows it (get_job, `pgworker show`, the HTTP job, the dashboard's job page); a bad one is refused
naming the field, with nothing written; an idempotency key finds its job whatever key is given
the second time; migration 16 keeps the old function's grants."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

import pgworker
import pgworker.sync
from pgworker import JobSpec

from .helpers import cli
from .test_dashboard import http
from .test_sql_enqueue import migrated_to
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

# A key COPY's text format must escape (tab, newline, backslash) and that HTML must escape.
ODD = "cust\t42\n\\N <b>&"
TOO_LONG = "k" * 201
BAD = [
    ("", "must be a non-empty string"),
    (TOO_LONG, "must be at most 200 characters"),
    (42, "must be a non-empty string"),
    ("a\x00b", "NUL"),
    ("a\ud800", "lone surrogate"),
]
FUNCTION = (
    "pgworker.enqueue(text, jsonb, text, anycompatible, bigint, text, text, timestamptz, "
    "interval, bigint, text)"
)


async def keys(conn: Any) -> list[str | None]:
    """The concurrency keys of every job, in the order of their ids."""
    return [r[0] for r in await conn.fetch("SELECT concurrency_key FROM pgworker.jobs ORDER BY id")]


async def count(conn: Any) -> int:
    return await conn.fetchval("SELECT count(*) FROM pgworker.jobs")


def task_and_registry() -> tuple[Any, pgworker.Registry]:
    """A task limited per key, by its handle, and its registry."""
    registry = pgworker.Registry()

    @registry.task("sync-account", max_running_per_key=1)
    async def sync_account(ctx: pgworker.JobContext, payload: dict) -> None:
        return None

    return sync_account, registry


async def test_enqueue_stores_the_key_and_get_job_reads_it(conn):
    result = await pgworker.enqueue(conn, "t", {"n": 1}, concurrency_key="customer-42")
    assert result.job.concurrency_key == "customer-42"
    odd = await pgworker.enqueue(conn, "t", {"n": 2}, concurrency_key=ODD)
    plain = await pgworker.enqueue(conn, "t", {"n": 3})
    assert plain.job.concurrency_key is None
    assert await keys(conn) == ["customer-42", ODD, None]
    assert (await pgworker.get_job(conn, odd.job.id)).concurrency_key == ODD
    at_limit = await pgworker.enqueue(conn, "t", concurrency_key="k" * 200)
    assert (await pgworker.get_job(conn, at_limit.job.id)).concurrency_key == "k" * 200


@pytest.mark.parametrize("scheduled", [False, True], ids=["copy", "insert"])
async def test_enqueue_many_stores_each_specs_key(conn, scheduled):
    """Without idempotency keys or schedules the batch is COPY's (600 specs: two chunks), else
    one INSERT; either way each job holds its own key, and the results say so."""
    extra = {"delay": 0} if scheduled else {}
    wanted = [None if n % 3 == 0 else ODD if n % 3 == 1 else f"c-{n}" for n in range(600)]
    specs = [JobSpec("t", {"n": n}, concurrency_key=k, **extra) for n, k in enumerate(wanted)]
    results = await pgworker.enqueue_many(conn, specs)
    assert [r.job.concurrency_key for r in results] == wanted
    assert await keys(conn) == wanted
    # A batch where no spec has a key still writes none.
    await conn.execute("DELETE FROM pgworker.jobs")
    await pgworker.enqueue_many(conn, [JobSpec("t", {"n": n}, **extra) for n in range(3)])
    assert await keys(conn) == [None] * 3


async def test_a_tasks_handle_and_the_registry_pass_the_key(conn):
    handle, registry = task_and_registry()
    one = await handle.enqueue(conn, {"a": 1}, concurrency_key="h-1")
    many = await handle.enqueue_many(conn, [{"a": 2}, {"a": 3}], concurrency_key="h-2")
    [spec] = await pgworker.enqueue_many(conn, [handle.spec({"a": 4}, concurrency_key="h-3")])
    by_name = await registry.enqueue(conn, "sync-account", {"a": 5}, concurrency_key="r-1")
    assert [r.job.concurrency_key for r in (one, *many, spec, by_name)] == [
        "h-1",
        "h-2",
        "h-2",
        "h-3",
        "r-1",
    ]
    assert await keys(conn) == ["h-1", "h-2", "h-2", "h-3", "r-1"]


async def test_psycopg_and_pgworker_sync_pass_the_key(conn, dsn):
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        await pgworker.enqueue(aconn, "t", {"n": 1}, concurrency_key="async-1")
        await pgworker.enqueue_many(aconn, [JobSpec("t", {"n": 2}, concurrency_key="async-2")])
    with psycopg.connect(dsn) as sconn:
        pgworker.sync.enqueue(sconn, "t", {"n": 3}, concurrency_key="sync-1")
        pgworker.sync.enqueue_many(sconn, [JobSpec("t", {"n": 4}, concurrency_key=ODD)])
    assert await keys(conn) == ["async-1", "async-2", "sync-1", ODD]


@pytest.mark.parametrize(("bad", "says"), BAD, ids=["empty", "201", "int", "nul", "surrogate"])
async def test_a_bad_key_is_refused_naming_it_and_nothing_is_written(conn, bad, says):
    with pytest.raises(pgworker.ValidationError, match=says) as caught:
        await pgworker.enqueue(conn, "t", {}, concurrency_key=bad)
    assert caught.value.field == "concurrency_key"
    handle, _ = task_and_registry()
    with pytest.raises(pgworker.ValidationError) as caught:
        await handle.enqueue_many(conn, [{"a": 1}, {"a": 2}], concurrency_key=bad)
    assert caught.value.field == "concurrency_key"
    # The bad spec after COPY's first chunk of 500, whose rows are already sent: rolled back.
    for extra in ({}, {"idempotency_key": "k"}):
        specs = [JobSpec("t", {"n": n}, concurrency_key="ok") for n in range(700)]
        specs[600] = JobSpec("t", {"n": 600}, concurrency_key=bad, **extra)
        with pytest.raises(pgworker.ValidationError, match=says) as caught:
            await pgworker.enqueue_many(conn, specs)
        assert caught.value.field == "specs[600].concurrency_key"
    assert await count(conn) == 0


async def test_an_idempotency_key_finds_its_job_whatever_the_concurrency_key(conn):
    """Like queue and priority, the concurrency key is not part of "the same work": a second
    enqueue with another key (or none) gets the first job back, its key unchanged."""
    first = await pgworker.enqueue(conn, "t", {"a": 1}, idempotency_key="i", concurrency_key="x")
    for other in ("y", None):
        again = await pgworker.enqueue(
            conn, "t", {"a": 1}, idempotency_key="i", concurrency_key=other
        )
        assert (again.created, again.job.id, again.job.concurrency_key) == (
            False,
            first.job.id,
            "x",
        )
    [many] = await pgworker.enqueue_many(
        conn, [JobSpec("t", {"a": 1}, idempotency_key="i", concurrency_key="z")]
    )
    assert (many.created, many.job.concurrency_key) == (False, "x")
    row = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', '{\"a\": 1}', idempotency_key => 'i', "
        "concurrency_key => 'w')"
    )
    assert (row["id"], row["created"]) == (first.job.id, False)
    with pytest.raises(pgworker.IdempotencyConflict):
        await pgworker.enqueue(conn, "t", {"a": 2}, idempotency_key="i", concurrency_key="x")
    assert await keys(conn) == ["x"]


async def test_the_sql_function_takes_the_key_by_name_and_by_position(conn):
    named = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('sync-account', '{\"account\": 42}', "
        "concurrency_key => 'customer-42')"
    )
    assert named["created"]
    positional = await conn.fetchrow(
        "SELECT * FROM pgworker.enqueue('t', '{}', 'default', 0, NULL, NULL, NULL, NULL, NULL, "
        "1, $1)",
        ODD,
    )
    # The calls of before migration 16, by position and by name, find the one function.
    old = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', '{}', 'q', 5)")
    by_name = await conn.fetchrow("SELECT * FROM pgworker.enqueue('t', version => 2)")
    assert (await pgworker.get_job(conn, named["id"])).concurrency_key == "customer-42"
    assert (await pgworker.get_job(conn, positional["id"])).concurrency_key == ODD
    assert await keys(conn) == ["customer-42", ODD, None, None]
    assert (old["created"], by_name["created"]) == (True, True)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname = 'enqueue' "
            "AND pronamespace = 'pgworker'::regnamespace"
        )
        == 1
    )
    assert await conn.fetchval(
        "SELECT 'concurrency_key' = ANY(proargnames) FROM pg_proc WHERE proname = 'enqueue' "
        "AND pronamespace = 'pgworker'::regnamespace"
    )


@pytest.mark.parametrize(
    ("value", "says"),
    [("''", "must be a non-empty string"), (f"'{TOO_LONG}'", "must be at most 200 characters")],
    ids=["empty", "201"],
)
async def test_the_sql_function_refuses_a_bad_key_naming_it(conn, value, says):
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetch(f"SELECT * FROM pgworker.enqueue('t', concurrency_key => {value})")
    assert caught.value.sqlstate == "22023"
    assert caught.value.column_name == "concurrency_key"
    assert str(caught.value).startswith(f"concurrency_key: {says}")
    assert await count(conn) == 0


async def test_the_sql_function_checks_the_key_in_pythons_order(conn):
    """After version, before the payload: the first refused argument is the one both name."""
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.fetch("SELECT * FROM pgworker.enqueue('t', version => 0, concurrency_key => '')")
    assert caught.value.column_name == "version"
    with pytest.raises(pgworker.ValidationError) as refused:
        await pgworker.enqueue(conn, "t", version=0, concurrency_key="")
    assert refused.value.field == "version"


async def test_migration_16_keeps_the_functions_grants(empty_dsn):
    """A deployment that revoked EXECUTE from PUBLIC and granted it to one role keeps that."""
    conn = await asyncpg.connect(empty_dsn)
    roles = ("pgw_ckey_granted", "pgw_ckey_other")
    try:
        for role in roles:
            await conn.execute(f"DROP ROLE IF EXISTS {role}")
            await conn.execute(f"CREATE ROLE {role}")
        await migrated_to(conn, 15)
        old = FUNCTION.removesuffix(", text)") + ")"
        await conn.execute(f"REVOKE EXECUTE ON FUNCTION {old} FROM PUBLIC")
        await conn.execute(f"GRANT EXECUTE ON FUNCTION {old} TO {roles[0]} WITH GRANT OPTION")
        await apply_only(conn, 16)  # later ones re-create it again (test_unique.py)
        allowed = "SELECT has_function_privilege($1, $2, $3)"
        assert await conn.fetchval(allowed, roles[0], FUNCTION, "EXECUTE WITH GRANT OPTION")
        assert not await conn.fetchval(allowed, roles[1], FUNCTION, "EXECUTE")
    finally:
        for role in roles:
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()


async def test_migration_16_leaves_the_default_grants_default(empty_dsn):
    conn = await asyncpg.connect(empty_dsn)
    try:
        await migrated_to(conn, 16)
        acl = await conn.fetchval(
            "SELECT proacl FROM pg_proc WHERE oid = $1::regprocedure", FUNCTION
        )
        assert acl is None  # EXECUTE for PUBLIC, as any new function
    finally:
        await conn.close()


async def apply_only(conn: Any, version: int) -> None:
    """Apply the one migration `version` on a schema migrated to the one before it."""
    from pgworker._db import files
    from pgworker._db.queries import queries

    [m] = [m for m in files.migrations("pgworker") if m.version == version]
    async with conn.transaction():
        await conn.execute(m.sql)
        await queries("pgworker").migrations_record(conn, m.version, m.name)


async def test_the_cli_enqueues_and_shows_the_key(conn, dsn):
    out = cli("enqueue", "t", "--concurrency-key", "customer-42", "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["id"]
    assert (await pgworker.get_job(conn, job_id)).concurrency_key == "customer-42"
    shown = cli("show", str(job_id), "--dsn", dsn)
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if "concurrency_key" in line]
    assert line.split() == ["concurrency_key", "customer-42"]
    shown = cli("show", str(job_id), "--json", "--dsn", dsn)
    assert json.loads(shown.stdout)["job"]["concurrency_key"] == "customer-42"
    refused = cli("enqueue", "t", "--concurrency-key", TOO_LONG, "--dsn", dsn)
    assert refused.returncode == 2 and "concurrency_key" in refused.stderr
    assert await count(conn) == 1


async def test_http_takes_and_shows_the_key_and_the_dashboard_shows_it(conn, dsn):
    async with serving(dsn) as served, served.client() as api:
        created = await api.post(
            "/jobs", json={"type": "t", "payload": {}, "concurrency_key": "customer-42"}
        )
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["concurrency_key"] == "customer-42"
        assert (await api.get(f"/jobs/{job['id']}")).json()["concurrency_key"] == "customer-42"
        plain = (await api.post("/jobs", json={"type": "t", "payload": {}})).json()
        assert plain["concurrency_key"] is None
        for bad in ("", TOO_LONG, 42, ["k"], "a\u0000b"):
            refused = await api.post(
                "/jobs", json={"type": "t", "payload": {}, "concurrency_key": bad}
            )
            assert refused.status_code == 422, refused.text
            assert refused.json()["field"] == "concurrency_key", refused.text
        document = (await api.get("/openapi.json")).json()
        field = document["components"]["schemas"]["EnqueueBody"]["properties"]["concurrency_key"]
        [text] = [t for t in field["anyOf"] if t.get("type") == "string"]
        assert (text["minLength"], text["maxLength"]) == (1, 200)
        odd = await pgworker.enqueue(conn, "t", concurrency_key=ODD)
        async with http(served) as page:
            html = (await page.get(f"/ui/jobs/{odd.job.id}")).text
            assert "Concurrency key" in html and "\\N &lt;b&gt;&amp;" in html
            assert "Concurrency key" not in (await page.get(f"/ui/jobs/{plain['id']}")).text
    assert await keys(conn) == ["customer-42", None, ODD]
