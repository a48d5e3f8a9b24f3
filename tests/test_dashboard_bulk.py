"""The dashboard's job lists and bulk actions, against a real server, database and (Debian's)
Chromium: lists that show why (each row's error, its traceback one click away; failures grouped by
error on the needs-attention page), the one filter in a shareable URL (payload containment), and
bulk actions over it with a confirmation stating the count, a progress page, CSRF, origin and
read-only checks.
Screenshots go to PGWORKER_SCREENSHOTS, else a temporary directory (never committed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from .helpers import wait_for
from .test_bulk import replays_of, seed_failed
from .test_dashboard import browser, csrf_of, css, http, log_in, page, until
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["browser", "page"]  # the fixtures, used by name


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


async def test_bulk_replay_of_1000_failed_jobs_from_a_filter_with_the_count_confirmed(
    page: Any, dsn: str, conn: Any, tmp_path: Path
) -> None:
    ids = await seed_failed(conn, 1000, error="ValueError: remote down")
    others = await seed_failed(conn, 3, error="KeyError: 'customer'")
    out = _shots(tmp_path)
    async with serving(dsn, env={"PGWORKER_BULK_BATCH": "100"}) as served:
        log_in(page, served)
        # The needs-attention page: failures grouped by cause, each a link to its jobs.
        page.get(f"{served.url}/ui/jobs?status=failed")
        groups = css(page, "#failure-groups").text
        assert "1,000 send-invoice ValueError: remote down" in groups
        assert "3 send-invoice KeyError: 'customer'" in groups
        page.save_screenshot(str(out / "needs-attention.png"))
        css(page, "#failure-groups tr[data-group] a").click()  # the largest group first
        until(page, lambda d: "error_group=" in d.current_url)
        # Each row shows its error; its traceback is one click away.
        row_error = css(page, "td.error details summary")
        assert row_error.text == "ValueError: remote down"
        row_error.click()
        assert "Traceback" in css(page, "td.error details pre").text
        css(page, "nav.bulk a.primary").click()
        until(page, lambda d: "/ui/jobs/actions/new" in d.current_url)
        assert css(page, "#matched").text == "1,000"
        page.save_screenshot(str(out / "bulk-confirm.png"))
        css(page, "form.bulk button[type=submit]").click()
        until(page, lambda d: "/ui/jobs/actions/" in d.current_url and "new" not in d.current_url)
        # The progress page refreshes itself until the action is done.
        until(page, lambda d: css(d, "#progress").get_attribute("data-state") == "done", 120)
        assert "1,000 jobs replayed" in css(page, "#progress").text
        page.save_screenshot(str(out / "bulk-progress.png"))
    assert await replays_of(conn, ids) == dict.fromkeys(ids, 1)
    assert await replays_of(conn, others) == {}
    actors = await conn.fetch("SELECT DISTINCT actor FROM pgworker.job_events")
    assert [r["actor"] for r in actors] == ["dashboard"]


async def test_search_by_payload_containment_in_a_shareable_url(
    page: Any, dsn: str, conn: Any, tmp_path: Path
) -> None:
    mine = await seed_failed(conn, 2, customer_id=42)
    await seed_failed(conn, 2, customer_id=7)
    async with serving(dsn) as served:
        log_in(page, served)
        page.get(f"{served.url}/ui/jobs")
        box = css(page, "input[name=payload]")
        box.send_keys('{"customer_id": 42}')
        css(page, "form.filters button[type=submit]").click()
        until(page, lambda d: "payload=" in d.current_url)
        shown = {a.text for a in page.find_elements("css selector", "table.jobs td a")}
        assert shown == {f"#{i}" for i in mine}
        shared = page.current_url
        page.save_screenshot(str(_shots(tmp_path) / "payload-search.png"))
        page.delete_all_cookies()
        log_in(page, served)
        page.get(shared)  # the URL alone gives the same list back
        shown = {a.text for a in page.find_elements("css selector", "table.jobs td a")}
        assert shown == {f"#{i}" for i in mine}


async def test_markup_in_an_error_is_text_in_the_list_and_its_groups(dsn: str, conn: Any) -> None:
    await seed_failed(
        conn, 2, error="ValueError: <script>alert(1)</script><img src=x onerror=alert(2)>"
    )
    async with serving(dsn) as served, http(served) as client:
        for path in ("/ui/jobs", "/ui/jobs?status=failed"):
            html = (await client.get(path)).text
            assert "<script>alert" not in html and "<img src=x" not in html, path
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path


async def test_bulk_forms_need_csrf_same_origin_and_a_writable_server(dsn: str, conn: Any) -> None:
    ids = await seed_failed(conn, 3)
    query = urlencode({"kind": "replay", "status": "failed"})
    async with serving(dsn) as served, http(served) as client:
        confirm = await client.get(f"/ui/jobs/actions/new?{query}")
        assert confirm.status_code == 200 and 'id="matched">3<' in confirm.text
        token = csrf_of(confirm.text)
        form = {"kind": "replay", "status": "failed", "max_id": str(max(ids))}
        for data, headers in [
            (form, {}),
            ({**form, "csrf": "x"}, {}),
            ({**form, "csrf": token}, {"Origin": "http://evil.example"}),
            ({**form, "csrf": token}, {"Sec-Fetch-Site": "cross-site"}),
        ]:
            answer = await client.post("/ui/jobs/actions", data=data, headers=headers)
            assert answer.status_code == 403, (data, headers)
        assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 0
        bad = await client.post("/ui/jobs/actions", data={**form, "csrf": token, "status": "x"})
        assert bad.status_code == 400 and "status" in bad.text
        done = await client.post("/ui/jobs/actions", data={**form, "csrf": token})
        assert done.status_code == 303
        progress = done.headers["location"]
        await wait_for(
            lambda: conn.fetchval("SELECT state = 'done' FROM pgworker.bulk_actions"), timeout=30
        )
        assert "3 jobs replayed" in (await client.get(progress)).text
    async with serving(dsn, "--read-only") as served, http(served) as client:
        assert (await client.get(f"/ui/jobs/actions/new?{query}")).status_code == 405
        page_html = (await client.get("/ui/jobs")).text
        assert "all matching" not in page_html
        answer = await client.post("/ui/jobs/actions", data={**form, "csrf": token})
        assert answer.status_code in (403, 405)
    assert await conn.fetchval("SELECT count(*) FROM pgworker.bulk_actions") == 1
