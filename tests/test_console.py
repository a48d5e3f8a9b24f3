"""The operator console's live parts, against a real `pgworker serve`
and a real database: GET /stats (and /ui/stats) count a seeded hour; in Debian's headless
Chromium, a chart drawn, a count that changes without a reload, a pause from a queue's page, the
workers page's gone worker and HTTP claimer; markup in queue and type names shown as text; the
queue page's forms refused without their CSRF token or from another origin; the JSON refused
without a login or a token. Screenshots go to PGWORKER_SCREENSHOTS, else a temporary directory
(never committed)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import pgworker

from .test_dashboard import WAIT, browser, csrf_of, css, http, log_in, page, text_of, until
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

__all__ = ["browser", "page"]  # the fixtures, imported for this module's tests

HOSTILE = '<img src=x onerror="window.pwned=1">'


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path) / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


async def _seed_hour(conn: Any, queue: str = "mail", type_: str = "send-invoice") -> int:
    """In one minute of the last hour: 4 jobs enqueued, and attempts of them 3 completed, 2
    failed (one retried, then completed); each waited 2 s and ran 0.5 s. Returns that minute's
    start (seconds since the epoch)."""
    now = datetime.now(UTC)
    minute = (now - timedelta(minutes=10)).replace(second=0, microsecond=0)
    at = minute + timedelta(seconds=5)
    rows = [  # (status, attempts) of each job; one job's first attempt was retried
        ("completed", 1),
        ("completed", 1),
        ("completed", 2),
        ("failed", 1),
    ]
    for status, attempts in rows:
        job_id = await conn.fetchval(
            "INSERT INTO pgworker.jobs (type, queue, status, attempts, run_at, created_at,"
            " claimed_at, finished_at) VALUES ($1, $2, $3, $4, $5, $5, $6, $6)"
            " RETURNING id",
            type_,
            queue,
            status,
            attempts,
            at - timedelta(seconds=2),
            at,
        )
        for n in range(1, attempts + 1):
            outcome = "retried" if n < attempts else status
            await conn.execute(
                "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,"
                " correlation_id, outcome, started_at, finished_at)"
                " VALUES ($1, $2, $3, $4, 'w', 'c', $5, $6, $7)",
                job_id,
                n,
                type_,
                queue,
                outcome,
                at,
                at + timedelta(milliseconds=500),
            )
    return int(minute.timestamp())


def _bucket(stats: dict[str, Any], minute: int) -> dict[str, Any]:
    i = stats["at"].index(minute)
    return {k: v[i] for k, v in stats.items() if isinstance(v, list)}


# --- the numbers ----------------------------------------------------------------------------------


async def test_stats_count_a_seeded_hour_per_minute_queue_and_type(dsn, conn):
    minute = await _seed_hour(conn)
    await _seed_hour(conn, queue="media", type_="resize-image")  # elsewhere, same minute
    async with serving(dsn) as served, served.client(timeout=WAIT) as client:
        answer = await client.get("/stats", params={"window": "hour", "queue": "mail"})
        assert answer.status_code == 200, answer.text
        stats = answer.json()
        assert stats["bucket_seconds"] == 60 and len(stats["at"]) == 60
        seen = _bucket(stats, minute)
        assert (seen["enqueued"], seen["completed"], seen["failed"]) == (4, 3, 2)
        assert seen["wait_p50"] == pytest.approx(2.0) and seen["wait_p95"] == pytest.approx(2.0)
        assert seen["run_p50"] == pytest.approx(0.5) and seen["run_p95"] == pytest.approx(0.5)
        assert stats["totals"] == {"enqueued": 4, "completed": 3, "failed": 2}
        assert stats["sampled"] == 1
        # Every other minute is there, empty.
        assert sum(stats["enqueued"]) == 4 and stats["wait_p50"].count(None) == 59

        everywhere = (await client.get("/stats")).json()
        assert everywhere["totals"] == {"enqueued": 8, "completed": 6, "failed": 4}
        one_type = (await client.get("/stats", params={"type": "resize-image"})).json()
        assert one_type["totals"] == {"enqueued": 4, "completed": 3, "failed": 2}
        assert _bucket(one_type, minute)["run_p95"] == pytest.approx(0.5)
        day = (await client.get("/stats", params={"window": "day"})).json()
        assert day["bucket_seconds"] == 600 and len(day["at"]) == 144
        assert day["totals"] == everywhere["totals"]

        bad = await client.get("/stats", params={"window": "week"})
        assert bad.status_code == 422 and bad.json()["field"] == "window"
        # The API's token is needed.
        async with served.client(timeout=WAIT) as anonymous:
            anonymous.headers.pop("Authorization", None)
            assert (await anonymous.get("/stats")).status_code == 401

        async with http(served) as browser_client:
            ui = await browser_client.get("/ui/stats", params={"queue": "mail"})
            assert ui.status_code == 200 and ui.json()["totals"] == stats["totals"]
            bad = await browser_client.get("/ui/stats", params={"window": "week"})
            assert bad.status_code == 422 and bad.json()["field"] == "window"


async def test_the_json_the_pages_poll_needs_a_login(dsn, conn):
    await pgworker.enqueue(conn, "send-invoice", {}, queue="mail")
    async with serving(dsn) as served:
        async with http(served, login=False) as client:
            for path in ("/ui/live", "/ui/stats"):
                answer = await client.get(path)
                assert answer.status_code == 401, path
                assert "log in" in answer.json()["error"]
            # A bearer token is not a dashboard session either.
            answer = await client.get("/ui/live", headers=served.headers)
            assert answer.status_code == 401
        async with http(served) as client:
            live = (await client.get("/ui/live")).json()
            assert live["queues"]["mail"]["pending"] == 1 and live["totals"]["pending"] == 1
            assert (
                "script-src 'self'"
                in (await client.get("/ui/live")).headers["content-security-policy"]
            )


# --- in the browser -------------------------------------------------------------------------------


async def test_a_chart_is_drawn_and_a_count_changes_without_a_reload(page, dsn, conn, tmp_path):
    minute = await _seed_hour(conn)
    await pgworker.enqueue(conn, "send-invoice", {"n": 1}, queue="mail")
    async with serving(dsn) as served:
        log_in(page, served)
        until(page, lambda d: css(d, "[data-chart]").get_attribute("data-drawn") == "hour")
        assert len(page.find_elements("css selector", "[data-chart] canvas")) >= 2
        # The chart's own endpoint, as the page's script reads it: 4 + 1 jobs enqueued.
        assert css(page, "[data-chart]").get_attribute("data-total-enqueued") == "5"
        # Attempts, retries included: not the jobs that need attention.
        said = "5 jobs enqueued · 3 attempts completed · 2 failed attempts (retries included)"
        assert said in text_of(page)
        pending = css(page, "[data-live-total=pending]")
        assert pending.text == "1"
        page.execute_script("window.notReloaded = true")
        await pgworker.enqueue(conn, "send-invoice", {"n": 2}, queue="mail")
        await pgworker.enqueue(conn, "send-invoice", {"n": 3}, queue="mail")
        until(page, lambda d: css(d, "[data-live-total=pending]").text == "3")
        cell = "[data-live-queue=mail][data-live-status=pending]"
        until(page, lambda d: css(d, cell).text == "3")
        assert page.execute_script("return window.notReloaded") is True
        page.get_screenshot_as_file(str(_shots(tmp_path) / "queues-live.png"))

        page.get(f"{served.url}/ui/queues/mail")
        until(page, lambda d: css(d, "[data-chart]").get_attribute("data-drawn") == "hour")
        assert css(page, "[data-chart]").get_attribute("data-queue") == "mail"
        css(page, "button[data-window=day]").click()
        until(page, lambda d: css(d, "[data-chart]").get_attribute("data-drawn") == "day")
        page.get_screenshot_as_file(str(_shots(tmp_path) / "queue.png"))
    assert minute


async def test_pause_and_resume_from_the_queue_page(page, dsn, conn, tmp_path):
    await pgworker.enqueue(conn, "send-invoice", {}, queue="mail")
    async with serving(dsn) as served:
        log_in(page, served)
        css(page, "a[href='/ui/queues/mail']").click()
        until(page, lambda d: d.current_url == f"{served.url}/ui/queues/mail")
        assert "Queue mail" in text_of(page)
        css(page, "form[action='/ui/queues/pause'] button").click()
        until(page, lambda d: "Queue mail is paused" in text_of(d))
        assert page.current_url == f"{served.url}/ui/queues/mail"
        paused = await conn.fetchval("SELECT paused_by FROM pgworker.queues WHERE name = 'mail'")
        assert paused == "dashboard"
        page.get_screenshot_as_file(str(_shots(tmp_path) / "queue-paused.png"))
        css(page, "input[name=max_running]").send_keys("4")
        css(page, "form[action='/ui/queues/limit'] button").click()
        until(page, lambda d: "at most 4 running" in text_of(d))
        assert page.current_url == f"{served.url}/ui/queues/mail"
        css(page, "form[action='/ui/queues/resume'] button").click()
        until(page, lambda d: "Queue mail is resumed" in text_of(d))
        assert (
            await conn.fetchval("SELECT paused_at FROM pgworker.queues WHERE name = 'mail'")
        ) is None


async def test_the_workers_page_shows_a_gone_worker_and_an_http_claimer(page, dsn, conn, tmp_path):
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency,"
        " lease, last_seen_at) VALUES"
        " ('w-live', 'h1', 11, '{mail}', '{t}', 4, 30, now()),"
        " ('w-gone', 'h2', 12, '{mail}', '{t}', 4, 30, now() - interval '2 min'),"
        " ('w-old', 'h3', 13, '{mail}', '{t}', 4, 30, now() - interval '25 hours')"
    )
    await pgworker.enqueue(conn, "send-invoice", {}, queue="mail")
    async with serving(dsn) as served:
        async with served.client(timeout=WAIT) as client:
            claim = {"worker_id": "billing-go-1", "queues": ["mail"], "lease": 120.0}
            answer = await client.post("/jobs/claim", json=claim)
            assert answer.status_code == 200, answer.text
        log_in(page, served)
        page.get(f"{served.url}/ui/workers")
        rows = {
            r.find_element("css selector", "td b").text: r
            for r in page.find_elements("css selector", "tr[data-worker-state]")
        }
        assert set(rows) == {"w-live", "w-gone", "billing-go-1"}  # w-old: past 24 h
        assert rows["w-gone"].get_attribute("data-worker-state") == "gone"
        assert "gone: not seen for 2 min" in rows["w-gone"].text
        assert rows["w-live"].get_attribute("data-worker-state") == "live"
        http_row = rows["billing-go-1"]
        assert http_row.get_attribute("data-worker-state") == "live"
        assert "HTTP claimer" in http_row.text and "pid" not in http_row.text
        assert "lease 2 min" in http_row.text
        page.get_screenshot_as_file(str(_shots(tmp_path) / "workers.png"))
        page.get(f"{served.url}/ui/queues/mail")
        shown = text_of(page)
        assert "billing-go-1" in shown and "HTTP claimer" in shown and "w-gone" in shown


async def test_markup_in_queue_and_type_names_is_shown_as_text(page, dsn, conn, tmp_path):
    await pgworker.enqueue(conn, HOSTILE, {}, queue=HOSTILE)
    await _seed_hour(conn, queue=HOSTILE, type_=HOSTILE)
    async with serving(dsn) as served:
        log_in(page, served)
        until(page, lambda d: d.find_element("css selector", "[data-chart]"))
        link = css(page, f"a[href='/ui/queues/{quote(HOSTILE, safe='')}']")
        assert link.text == HOSTILE
        link.click()
        until(page, lambda d: css(d, "[data-chart]").get_attribute("data-drawn") == "hour")
        assert f"Queue {HOSTILE}" in text_of(page)
        assert css(page, "[data-chart]").get_attribute("data-total-enqueued") == "5"
        until(
            page,
            lambda d: (
                css(d, "[data-live-status=pending]").get_attribute("data-live-queue") == HOSTILE
            ),
        )
        assert not page.find_elements("css selector", "main img")
        assert page.execute_script("return window.pwned === undefined") is True
        async with http(served) as client:
            html = (await client.get(f"/ui/queues/{quote(HOSTILE, safe='')}")).text
            assert HOSTILE not in html and "&lt;img src=x" in html
            stats = await client.get("/ui/stats", params={"queue": HOSTILE, "type": HOSTILE})
            assert stats.json()["totals"]["enqueued"] == 5


async def test_the_queue_page_forms_need_their_csrf_token_and_origin(dsn, conn):
    await pgworker.enqueue(conn, "send-invoice", {}, queue="mail")
    async with serving(dsn) as served, http(served) as client:
        page_html = (await client.get("/ui/queues/mail")).text
        token = csrf_of(page_html)
        for action in ("pause", "resume", "limit"):
            assert f'action="/ui/queues/{action}"' in page_html or action == "resume"
        refused = [
            ({"queue": "mail", "back": "queue"}, {}),
            ({"queue": "mail", "back": "queue", "csrf": "forged"}, {}),
            ({"queue": "mail", "back": "queue", "csrf": token}, {"Origin": "http://evil.example"}),
        ]
        for form, headers in refused:
            for action in ("pause", "limit"):
                answer = await client.post(
                    f"/ui/queues/{action}", data={**form, "max_running": "3"}, headers=headers
                )
                assert answer.status_code == 403, (action, form, headers)
        assert await conn.fetchval("SELECT count(*) FROM pgworker.queues") == 0
        answer = await client.post(
            "/ui/queues/pause", data={"queue": "mail", "back": "queue", "csrf": token}
        )
        assert answer.status_code == 303
        assert answer.headers["location"] == "/ui/queues/mail"
        # A queue named like a button has its page too (GET on the button's path).
        assert (await client.get("/ui/queues/pause")).status_code == 200
        assert "Queue pause" in (await client.get("/ui/queues/pause")).text


# --- the live parts for a proxy user, past the shown queues, with thousands of rows ----------


USER = "X-Forwarded-User"


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
