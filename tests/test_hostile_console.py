"""Hostile tests of issue 25's operator console, against a real PostgreSQL and real servers: what a
hostile user or a careless operator reaches through the bulk actions, the filters, the named
operators, the trusted proxy header, the live pages and `pgworker jobs list`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

import pgworker

from .helpers import cli, has_status, serving_guarded, wait_for
from .test_dashboard import browser, csrf_of, css, http, log_in, page, until
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["browser", "page"]  # the fixtures, used by name

USER = "X-Forwarded-User"
EVIL = "https://evil.example"


async def operator_log(conn: Any) -> list[tuple[str, str, str]]:
    rows = await conn.fetch("SELECT actor, action, queue FROM pgworker.operator_log ORDER BY id")
    return [tuple(r) for r in rows]


# --- the trusted proxy header and --insecure-no-auth: credentials a browser sends by itself ----


async def test_a_page_of_another_site_cannot_act_as_the_proxy_user(dsn, conn):
    """Behind a proxy that names its user in a header, the browser's every request carries that
    user: a form of another site posting to the API would act as them (the bearer token never
    left a page; this does). A change whose Origin or Sec-Fetch-Site says another site is refused
    (403 naming Origin); the same change from this server's own origin goes through."""
    args = ("--trusted-user-header", USER, "--trusted-user-role", "operate")
    async with (
        serving(dsn, *args, token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        forged = [
            {USER: "carol", "Origin": EVIL},
            {USER: "carol", "Origin": "null"},
            {USER: "carol", "Sec-Fetch-Site": "cross-site"},
        ]
        for headers in forged:
            # what a <form method=post> of another site sends: no JSON, no token
            refused = await client.post(
                "/queues/mail/pause",
                headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
            )
            assert refused.status_code == 403, (headers, refused.text)
            assert refused.json()["field"] == "Origin"
            assert "another site" in refused.json()["error"]
        assert await operator_log(conn) == []
        # the browser's own origin, and a client that is not a browser (no Origin at all)
        own = await client.post("/queues/mail/pause", headers={USER: "carol", "Origin": served.url})
        assert own.status_code == 200, own.text
        plain = await client.post("/queues/mail/resume", headers={USER: "carol"})
        assert plain.status_code == 200, plain.text
    assert await operator_log(conn) == [("carol", "pause", "mail"), ("carol", "resume", "mail")]


async def test_a_page_of_another_site_cannot_act_on_an_insecure_no_auth_server(dsn, conn):
    """--insecure-no-auth on a trusted network: any page a browser on that network opens could
    post to it. A change from another site is refused; a script without Origin is not."""
    job = await pgworker.enqueue(conn, "t", {})
    async with (
        serving(dsn, "--insecure-no-auth", token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        refused = await client.post(f"/jobs/{job.job.id}/cancel", headers={"Origin": EVIL})
        assert refused.status_code == 403 and refused.json()["field"] == "Origin"
        assert await has_status(conn, job.job.id, "pending")
        assert (await client.post(f"/jobs/{job.job.id}/cancel")).status_code == 200
    assert await has_status(conn, job.job.id, "cancelled")


async def test_a_trusted_header_sent_twice_names_nobody(dsn, conn):
    """A proxy that appends its header to the client's rather than replacing it passes both on;
    the first is the client's, anyone's. Two values: no user (401, the login form), never the
    first one."""
    args = ("--trusted-user-header", USER, "--trusted-user-role", "operate")
    twice = [(USER, "mallory"), (USER, "carol")]
    async with (
        serving(dsn, *args, token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.get("/queues", headers=[(USER, "carol")])).status_code == 200
        assert (await client.get("/queues", headers=twice)).status_code == 401
        assert (await client.post("/queues/mail/pause", headers=twice)).status_code == 401
        page = await client.get("/", headers=twice)
        assert page.status_code == 303 and "/ui/login" in page.headers["location"]
    assert await operator_log(conn) == []


# --- times at the ends of the calendar -----------------------------------------------------------


async def test_a_reschedule_to_the_first_moment_of_year_1_does_not_stop_the_workers(dsn, conn):
    """0001-01-01T00:00:00Z is a valid RFC 3339 time, but asyncpg sends it as '-infinity': a job
    run_at -infinity made every claim of its queue fail (claimed_at - run_at overflows), and the
    worker's producer retried forever. It is kept one microsecond later, a finite time."""
    victim = await pgworker.enqueue(conn, "t", {}, queue="mail")
    async with serving(dsn) as served, served.client() as client:
        started = await client.post(
            "/jobs/actions/reschedule",
            json={"filter": {"queue": "mail"}, "run_at": "0001-01-01T00:00:00Z"},
        )
        assert started.status_code == 202, started.text
        action = started.json()["id"]

        async def done() -> bool:
            return (await client.get(f"/jobs/actions/{action}")).json()["status"] == "done"

        await wait_for(done, timeout=30)
        answered = (await client.get(f"/jobs/{victim.job.id}")).json()["run_at"]
        assert answered.startswith("0001-01-01T00:00:00.000001") and answered.endswith("+00:00")
    direct = await pgworker.enqueue(conn, "t", {}, run_at=datetime.min.replace(tzinfo=UTC))
    finite = "SELECT bool_and(isfinite(run_at)) FROM pgworker.jobs WHERE id = ANY($1)"
    assert await conn.fetchval(finite, [victim.job.id, direct.job.id])
    registry = pgworker.Registry()

    @registry.task("t")
    async def t(ctx: Any, payload: Any) -> None:
        return None

    async with serving_guarded(registry, dsn, queues=["mail", "default"]):
        for job_id in (victim.job.id, direct.job.id):
            await wait_for(lambda j=job_id: has_status(conn, j, "completed"), timeout=20)


# --- the CLI -------------------------------------------------------------------------------------


async def test_jobs_list_json_stays_json_with_control_characters_from_the_database(dsn, conn):
    """`jobs list --json` of a job whose values hold C1 controls (U+009B, the 8-bit CSI), ESC and
    a bidi override: valid JSON that gives the values back, and no raw control reaches the
    terminal (the escaper turned U+009B into `\\x9b`, which is not JSON)."""
    odd = "corr\u009b31m\x1b[2J\u202e"
    await pgworker.enqueue(conn, "t\x1b]0;pwned\x07", {}, correlation_id=odd)
    done = cli("jobs", "list", "--json", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07\u009b\u202e")
    (job,) = json.loads(done.stdout)["jobs"]
    assert job["correlation_id"] == odd and job["type"] == "t\x1b]0;pwned\x07"


# --- the dashboard's bulk form -----------------------------------------------------------------


async def test_a_bulk_forms_field_sent_as_a_file_is_refused_not_dropped(dsn, conn):
    """The confirmation's hidden fields are the filter: one sent as a file (multipart) was left
    out, and the action widened to every job (`status` dropped: every job replayed); `max_id` as
    a file was a 500. Each is refused (400) naming the field, and no action is created."""
    async with serving(dsn) as served, http(served) as client:
        csrf = csrf_of((await client.get("/ui/jobs")).text)
        for field in ("status", "queue", "max_id", "run_at"):
            form = {"csrf": csrf, "kind": "reschedule", "queue": "mail", "status": "pending"}
            form.pop(field, None)
            answer = await client.post(
                "/ui/jobs/actions", data=form, files={field: ("f", b"failed", "text/plain")}
            )
            assert answer.status_code == 400, (field, answer.status_code, answer.text[:300])
            assert f"{field}: must be text" in answer.text
    assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 0


# --- the live pages: what their script polls -----------------------------------------------------


async def test_the_live_counts_and_charts_answer_a_trusted_proxy_user(dsn, conn):
    """The pages show themselves to a user the proxy names; their script's polls (/ui/live,
    /ui/stats) answered that user 401, so the counts never moved and no chart was drawn."""
    await pgworker.enqueue(conn, "t", {}, queue="mail")
    args = ("--trusted-user-header", USER)
    async with (
        serving(dsn, *args, token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.get("/", headers={USER: "carol"})).status_code == 200
        live = await client.get("/ui/live", headers={USER: "carol"})
        assert live.status_code == 200, live.text
        assert live.json()["queues"]["mail"]["pending"] == 1
        stats = await client.get("/ui/stats", headers={USER: "carol"})
        assert stats.status_code == 200, stats.text
        # and still nobody without the header
        assert (await client.get("/ui/live")).status_code == 401


async def test_the_live_totals_count_every_queue_past_the_shown_ones(dsn, conn):
    """/ui/live reports at most SHOWN_QUEUES queues; its totals (the cards of the queues page)
    were the sum of those only, so with more queues the cards dropped to a wrong number at the
    first poll. The totals count every job; `truncated` says queues were left out."""
    from pgworker._web.console import SHOWN_QUEUES

    await conn.execute(
        "INSERT INTO pgworker.jobs (type, queue, payload) "
        "SELECT 't', 'q' || lpad(g::text, 5, '0'), '{}' FROM generate_series(1, $1) AS g",
        SHOWN_QUEUES + 5,
    )
    async with serving(dsn) as served, http(served) as client:
        live = (await client.get("/ui/live")).json()
    assert live["totals"]["pending"] == SHOWN_QUEUES + 5
    assert len(live["queues"]) == SHOWN_QUEUES and live["truncated"] is True


async def test_the_live_poll_answers_with_thousands_of_queues_and_workers(dsn, conn):
    """Every open page polls /ui/live every few seconds, and the queue page reads the same
    counts: they ran operations.status, whose queues-no-worker-serves check costs pending jobs
    times live workers. With 15,000 of each it ran past the statement timeout (a 503 for every
    poll, seconds of the database's time each). Both answer."""
    n = 15_000
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, queue, payload) "
        "SELECT 't', 'q' || g, '{}' FROM generate_series(1, $1) AS g",
        n,
    )
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency) "
        "SELECT 'w' || g, 'h', g, ARRAY['other' || g], ARRAY['t'], 1 "
        "FROM generate_series(1, $1) AS g",
        n,
    )
    async with serving(dsn) as served, http(served) as client:
        live = await client.get("/ui/live")
        assert live.status_code == 200, live.text
        assert live.json()["workers"] == n and live.json()["totals"]["pending"] == n
        queue = await client.get("/ui/queues/q1")
        assert queue.status_code == 200, queue.text


async def test_the_live_script_shows_queue_names_as_names_and_keeps_left_out_counts(
    page: Any, dsn: str, conn: Any
) -> None:
    """In a real Chromium. A queue named `constructor` (every JS object inherits one) with no
    waiting job showed "function Object() { [native code] }" as its oldest waiting job after
    the first poll; a queue past the SHOWN_QUEUES /ui/live reports had its counts set to 0."""
    from pgworker._web.console import SHOWN_QUEUES

    await pgworker.enqueue(conn, "t", {}, queue="constructor")
    await conn.execute("UPDATE pgworker.jobs SET status = 'completed', finished_at = now()")
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, queue, payload) "
        "SELECT 't', 'a' || lpad(g::text, 5, '0'), '{}' FROM generate_series(1, $1) AS g",
        SHOWN_QUEUES - 1,  # and constructor: the queues /ui/live reports; zz is left out
    )
    for _ in range(2):
        await pgworker.enqueue(conn, "t", {}, queue="zz")

    def polled(d: Any) -> bool:
        return bool(css(d, "body").get_attribute("data-live-at"))

    async with serving(dsn) as served:
        log_in(page, served)
        page.get(f"{served.url}/ui/queues/constructor")
        until(page, polled)
        oldest = css(page, "[data-live-oldest]").text
        assert oldest == "-", oldest
        assert css(page, "[data-live-status=completed]").text == "1"
        page.get(f"{served.url}/ui/queues/zz")
        until(page, polled)
        assert css(page, "[data-live-status=pending]").text == "2"


# --- the tokens file ---------------------------------------------------------------------------


async def test_a_tokens_file_saved_on_windows_reads_the_same(tmp_path):
    """A tokens file with a byte order mark and CRLF line ends (Notepad's UTF-8): the BOM made
    line 1's name invalid and `serve` refused to start."""
    import argparse

    from pgworker.cli._serve import _operators

    tokens = tmp_path / "tokens"
    tokens.write_bytes(
        "\ufeffalice:alice-token-0123456789:operate\r\nreader:reader-token-0123456789:read\r\n".encode()
    )
    found = _operators(argparse.Namespace(tokens_file=str(tokens)))
    assert [(o.name, o.token, o.role) for o in found] == [
        ("alice", "alice-token-0123456789", "operate"),
        ("reader", "reader-token-0123456789", "read"),
    ]


async def test_the_operator_log_refuses_a_cursor_past_the_calendar(dsn):
    """The Older link's cursor, edited to a time outside years 1 to 9999 once in UTC, was a 503
    "Database unavailable" (asyncpg could not send it): a 400 saying the page is not one."""
    async with serving(dsn) as served, http(served) as client:
        for cursor in ("0001-01-01T00:00:00+14:00|job|1", "9999-12-31T23:59:59-14:00|job|1"):
            answer = await client.get("/ui/log", params={"before": cursor})
            assert answer.status_code == 400, (cursor, answer.status_code)
            assert "not a page of the operator log" in answer.text
        assert (await client.get("/ui/log")).status_code == 200
