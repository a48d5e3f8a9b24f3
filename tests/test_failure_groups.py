"""Failures grouped as people think of them (migration 30): the normaliser sets aside the values a
message carries (numbers, ids, UUIDs, hex, quoted values, URLs, e-mail addresses, paths); 300
failures of 3 causes whose messages carry ids and values are 3 groups, the same ones in SQL, in
GET /failures and in `pgworker failed groups`; `error_group` filters GET /jobs and a bulk
action, so that "replay group" (the HTTP bulk API, then the Needs attention page in Chromium)
replays exactly one group; the rescue of a job whose worker vanished writes the fingerprint too;
the retried attempts are grouped apart."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

import pgworker
from pgworker import testing
from pgworker.operations import failure_groups

from .helpers import cli, wait_for
from .test_dashboard import browser, css, log_in, page, text_of, until
from .test_rescue import leader, lost_jobs
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["browser", "page"]  # the fixtures, imported for this module's tests


async def shapes(conn: Any, *messages: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT pgworker.error_shape(m) AS s FROM unnest($1::text[]) WITH ORDINALITY AS t(m, i) "
        "ORDER BY i",
        list(messages),
    )
    return [r["s"] for r in rows]


async def test_the_normaliser_sets_values_aside_and_keeps_the_words(conn: Any) -> None:
    cases = {
        "customer 4412 not found": "customer <n> not found",
        "order ord_8f3a2b not found for user 42": "order <n> not found for user <n>",
        "job 1b4e28ba-2fa1-11d2-883f-0016d3cca427 gone": "job <uuid> gone",
        "bad pointer 0xDEADbeef, digest a9f3c2d1e4": "bad pointer <hex>, digest <n>",
        "can't parse 'twelve euros' in \"total: x\"": "can't parse '?' in \"?\"",
        "open /var/lib/app/invoices/7.pdf failed": "open <path> failed",
        "C:\\Users\\ann\\report.xlsx is locked": "<path> is locked",
        "GET https://api.example.com/v1/items/77?x=1 returned 503": "GET <url> returned <n>",
        "mail to bob.smith@example.com bounced": "mail to <email> bounced",
        "timeout after 30.5s.  retry   later": "timeout after <n> retry later",
        "worker web-3-12345-a1b2c3 stopped renewing its lease": (
            "worker <n> stopped renewing its lease"
        ),
        "amount 12.50 exceeds 10": "amount <n> exceeds <n>",
        "utf-8 codec can't decode byte 0xff in position 3": (
            "<n> codec can't decode byte <hex> in position <n>"
        ),
        "no digits, no values": "no digits, no values",
    }
    assert await shapes(conn, *cases) == list(cases.values())
    group = "SELECT pgworker.error_group($1, $2, $3, $4)"
    a = await conn.fetchval(group, "bill", "KeyError", "customer 1 not found", None)
    assert a is not None and len(a) == 16 and int(a, 16) >= 0
    assert await conn.fetchval(group, "bill", "KeyError", "customer 99 not found", None) == a
    # The type, the class, the words and the innermost frame each make another group.
    assert await conn.fetchval(group, "mail", "KeyError", "customer 1 not found", None) != a
    assert await conn.fetchval(group, "bill", "LookupError", "customer 1 not found", None) != a
    assert await conn.fetchval(group, "bill", "KeyError", "supplier 1 not found", None) != a
    frame = (
        'Traceback (most recent call last):\n  File "/srv/app/v{}/tasks.py", line {}, in {}\n'
        "    raise KeyError(x)\nKeyError: customer 1 not found"
    )
    one = await conn.fetchval(group, "bill", "KeyError", "x", frame.format(1, 10, "bill"))
    # Another release's folder and line: the same frame, file:function.
    assert await conn.fetchval(group, "bill", "KeyError", "x", frame.format(2, 99, "bill")) == one
    assert await conn.fetchval(group, "bill", "KeyError", "x", frame.format(1, 10, "pay")) != one
    assert await conn.fetchval("SELECT pgworker.error_frame($1)", frame.format(1, 10, "bill")) == (
        "tasks.py:bill"
    )
    assert await conn.fetchval(group, "bill", None, "x", None) is None  # no error, no group


registry = pgworker.Registry()


@registry.task("bill", max_retries=0)
async def bill(ctx: pgworker.JobContext, payload: Any) -> None:
    n = payload["n"]
    cause = n % 3
    if cause == 0:
        raise LookupError(f"customer {1000 + n} not found (request {uuid.uuid4()})")
    if cause == 1:
        raise ValueError(f"invalid amount '{n}.{n % 7}0 EUR' for order ord_{n:06x}a")
    raise ConnectionError(f"GET https://pay.example.com/v1/charges/{n} failed after {n % 5}s")


async def three_causes(conn: Any, n: int = 300) -> dict[str, set[int]]:
    """`n` jobs of `bill` failed through a worker's own code (claim, handler, outcome's write),
    a third for each cause; their ids by fingerprint."""
    for i in range(n):
        await pgworker.enqueue(conn, "bill", {"n": i})
    await testing.drain(conn, registry, max_attempts=n + 1)
    rows = await conn.fetch("SELECT id, error_group FROM pgworker.jobs WHERE status = 'failed'")
    found: dict[str, set[int]] = {}
    for r in rows:
        found.setdefault(r["error_group"], set()).add(r["id"])
    return found


async def test_300_failures_of_3_causes_are_3_groups_and_replay_group_replays_one(
    page: Any, dsn: str, conn: Any
) -> None:
    groups = await three_causes(conn)
    assert sorted(map(len, groups.values())) == [100, 100, 100]
    assert None not in groups
    # Each attempt carries its job's group: the one place computed it once for both.
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs AS j JOIN pgworker.job_attempts AS a "
        "ON a.job_id = j.id WHERE a.error_group IS DISTINCT FROM j.error_group"
    )
    in_python = await failure_groups(conn)
    assert {g.fingerprint: g.count for g in in_python} == {k: 100 for k in groups}
    assert {g.error_class for g in in_python} == {"LookupError", "ValueError", "ConnectionError"}
    assert all(g.type == "bill" and sum(g.trend) == 100 and len(g.trend) == 24 for g in in_python)

    as_cli = cli("failed", "groups", "--json", "--dsn", dsn)
    assert as_cli.returncode == 0, as_cli.stderr
    assert json.loads(as_cli.stdout) == [g.as_json() for g in in_python]
    table = cli("failed", "groups", "--type", "bi", "--dsn", dsn)
    assert table.returncode == 0 and all(fp in table.stdout for fp in groups), table.stdout

    lookup, value, connection = (
        next(g.fingerprint for g in in_python if g.error_class == c)
        for c in ("LookupError", "ValueError", "ConnectionError")
    )
    async with serving(dsn) as served, served.client(timeout=30) as c:
        r = await c.get("/failures", params={"status": "failed"})
        assert r.status_code == 200, r.text
        answered = r.json()
        assert answered == [g.as_json() for g in in_python]
        fields = {"fingerprint", "type", "error_class", "count", "first_seen", "last_seen"}
        assert all(fields | {"sample", "trend"} == set(g) for g in answered)
        r = await c.get("/failures", params={"status": "completed"})
        assert r.status_code == 422 and r.json().get("field") == "status", r.text
        r = await c.get("/jobs", params={"error_group": value, "limit": 1000})
        assert r.status_code == 200 and {j["id"] for j in r.json()["jobs"]} == groups[value]
        r = await c.get("/jobs", params={"error_group": "not-a-group"})
        assert r.status_code == 422 and r.json().get("field") == "error_group", r.text

        # An HTTP worker's failure gets the group its words give, as a Python worker's.
        for n in (7, 8):
            await pgworker.enqueue(conn, "remote", {"n": n}, max_retries=0)
            claim = {"worker_id": "http-1", "types": ["remote"]}
            claimed = (await c.post("/jobs/claim", json=claim)).json()
            failed = await c.post(
                f"/jobs/{claimed['id']}/fail",
                json={
                    "worker_id": "http-1",
                    "attempt": claimed["attempt"],
                    "error": f"TimeoutError: upstream {n}0{n} timed out\n  at fetch (app.js:1)",
                },
            )
            assert failed.status_code == 200 and failed.json()["status"] == "failed", failed.text
        remote = await conn.fetch(
            "SELECT DISTINCT j.error_group AS job, a.error_group AS attempt "
            "FROM pgworker.jobs AS j JOIN pgworker.job_attempts AS a ON a.job_id = j.id "
            "WHERE j.type = 'remote'"
        )
        assert len(remote) == 1 and remote[0]["job"] == remote[0]["attempt"] is not None
        r = await c.get("/failures", params={"type": "remote"})
        assert [(g["fingerprint"], g["count"]) for g in r.json()] == [(remote[0]["job"], 2)]

        # Replay group, through the HTTP bulk API: exactly the 100 jobs of that group.
        started = await c.post(
            "/jobs/actions/replay", json={"filter": {"error_group": lookup}, "by": "alice"}
        )
        assert started.status_code == 202, started.text
        assert started.json()["matched"] == 100

        async def replayed(fingerprint: str) -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) = 100 FROM pgworker.jobs WHERE id = ANY($1::bigint[]) "
                    "AND status = 'pending'",
                    list(groups[fingerprint]),
                )
            )

        await wait_for(lambda: replayed(lookup), timeout=30, every=0.1)

        # Replay group, from the Needs attention page: the three groups left, each with its
        # count, sample and trend; the button goes through the bulk confirm and progress pages.
        log_in(page, served)
        page.get(f"{served.url}/ui/jobs?status=failed")
        until(page, lambda d: css(d, f"tr[data-group='{value}']"))
        shown = {
            e.get_attribute("data-group")
            for e in page.find_elements("css selector", "#failure-groups tr[data-group]")
        }
        assert shown == {value, connection, remote[0]["job"]}
        row = css(page, f"tr[data-group='{value}']")
        assert "100" in row.text and "invalid amount" in row.text
        trend = row.find_element("css selector", "svg.trend")
        assert sum(map(int, trend.get_attribute("data-trend").split(","))) == 100
        row.find_element("css selector", "a[data-action=replay-group]").click()
        until(page, lambda d: "/jobs/actions/new" in d.current_url)
        assert css(page, "#matched").text == "100", text_of(page)
        css(page, "form.bulk button[type=submit]").click()
        until(page, lambda d: "/jobs/actions/" in d.current_url and "new" not in d.current_url)
        await wait_for(lambda: replayed(value), timeout=30, every=0.1)
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status = 'failed' AND error_group = $1",
            connection,
        )
        == 100
    )
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs WHERE status = 'failed'") == 102
    # A replayed job's error, and so its group, is cleared with it.
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE status = 'pending' AND error_group IS NOT NULL"
    )


async def test_the_rescue_writes_the_fingerprint_and_retries_are_grouped_apart(
    dsn: str, conn: Any, pool: Any
) -> None:
    ids = await lost_jobs(conn, 3, type_="sync")
    await leader(pool, dsn).tick()
    rows = await conn.fetch(
        "SELECT j.status, j.error_group AS job_group, a.error_group AS attempt_group "
        "FROM pgworker.jobs AS j JOIN pgworker.job_attempts AS a ON a.job_id = j.id "
        "WHERE j.id = ANY($1::bigint[])",
        ids,
    )
    expected = await conn.fetchval(
        "SELECT pgworker.error_group('sync', 'WorkerLost', "
        "'worker ghost stopped renewing its lease', NULL)"
    )
    assert [(r["status"], r["job_group"], r["attempt_group"]) for r in rows] == [
        ("pending", expected, expected)
    ] * 3
    # Being retried: grouped under `retrying`, not under `failed`.
    retrying = await failure_groups(conn, status="retrying")
    assert [(g.fingerprint, g.type, g.error_class, g.count) for g in retrying] == [
        (expected, "sync", "WorkerLost", 3)
    ]
    assert "worker ghost stopped renewing its lease" in retrying[0].sample
    assert await failure_groups(conn, status="failed") == []
    # A replayable group's waiting jobs: the filter a "cancel group" confirms.
    listed = cli("jobs", "list", "--error-group", expected, "--json", "--dsn", dsn)
    assert listed.returncode == 0, listed.stderr
    assert sorted(j["id"] for j in json.loads(listed.stdout)["jobs"]) == ids
    with pytest.raises(pgworker.ValidationError, match="status"):
        await failure_groups(conn, status="completed")


async def test_the_migration_backfills_the_last_7_days_failures(conn: Any) -> None:
    """The backfill of migration 30, as its file says it (run again on rows written without a
    group): a failed job and its attempt get the group a worker's write gives them; a job
    failed 8 days ago, and a pending job an operator cancelled, get none."""
    from pgworker._db import files

    made = await conn.fetch(
        """
        INSERT INTO pgworker.jobs (type, status, attempts, error, finished_at)
        VALUES ('bill', 'failed', 1, 'KeyError: customer 12 not found', now()),
               ('bill', 'failed', 1, 'KeyError: customer 13 not found', now() - interval '8 d'),
               ('bill', 'cancelled', 0, 'Cancelled: cancelled by an operator', now())
        RETURNING id
        """
    )
    ids = [r["id"] for r in made]
    await conn.execute(
        "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, "
        "correlation_id, outcome, finished_at, error_type, error_message, error_detail) "
        "SELECT id, 1, type, queue, 'w', correlation_id, 'failed', now(), 'KeyError', "
        "substr(error, 11), $2 FROM pgworker.jobs WHERE id = ANY($1::bigint[]) AND attempts = 1",
        ids[:2],
        'Traceback (most recent call last):\n  File "/app/tasks.py", line 3, in bill\nKeyError',
    )
    sql = next(m.sql for m in files.migrations("pgworker") if m.version == 30)
    backfill = sql[sql.index('UPDATE "pgworker".job_attempts') : sql.index("CREATE INDEX")]
    await conn.execute(backfill)
    rows = await conn.fetch(
        "SELECT j.id, j.error_group AS job, a.error_group AS attempt FROM pgworker.jobs AS j "
        "LEFT JOIN pgworker.job_attempts AS a ON a.job_id = j.id WHERE j.id = ANY($1::bigint[]) "
        "ORDER BY j.id",
        ids,
    )
    expected = await conn.fetchval(
        "SELECT pgworker.error_group('bill', 'KeyError', 'customer 99 not found', $1)",
        'Traceback:\n  File "/srv/v2/tasks.py", line 9, in bill\nKeyError',
    )
    assert [(r["job"], r["attempt"]) for r in rows] == [
        (expected, expected),
        (None, expected),  # its attempt is of the last 7 days, the job's failure is not
        (None, None),
    ]
