"""The operator console in a real Chromium, mounted under /admin/jobs in a user's FastAPI app under
uvicorn: an `operate` operator pauses a queue from its page and the log names them; a
`read` operator sees no button and a forged press is refused (403); every page of the console is
drawn under the prefix. Screenshots of each page go to PGWORKER_SCREENSHOTS, else a temporary
directory (never committed)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import pgworker

from .test_dashboard import browser, css, page, until
from .test_mounted import PREFIX, ready, uvicorn

pytestmark = pytest.mark.asyncio(loop_scope="session")

__all__ = ["browser", "page"]  # the fixtures, imported for this module's tests

OPERATOR = "alice-token-0123456789"
READER = "reader-token-0123456789"
PAGES = {
    "queues": "/",
    "jobs": "/ui/jobs",
    "needs-attention": "/ui/jobs?status=failed",
    "queue": "/ui/queues/mail",
    "workers": "/ui/workers",
    "periodic": "/ui/periodic",
    "log": "/ui/log",
}


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path) / "mounted"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _log_in(driver: Any, url: str, token: str) -> None:
    driver.get(f"{url}{PREFIX}/")
    until(driver, lambda d: f"{PREFIX}/ui/login" in d.current_url)
    css(driver, "#token").send_keys(token)
    css(driver, f"form[action='{PREFIX}/ui/login'] button[type=submit]").click()
    until(driver, lambda d: d.current_url == f"{url}{PREFIX}/")


async def test_the_console_mounted_in_a_users_app_in_a_real_browser(page, dsn, conn, tmp_path):
    shots = _shots(tmp_path)
    await pgworker.enqueue(conn, "send-invoice", {"customer_id": 42}, queue="mail")
    failed = await pgworker.enqueue(conn, "send-invoice", {"customer_id": 7}, queue="mail")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now(),"
        " error = 'ValueError: remote down' WHERE id = $1",
        failed.job.id,
    )
    with uvicorn(dsn) as url:
        await ready(url)
        _log_in(page, url, OPERATOR)
        for name, path in PAGES.items():
            page.get(f"{url}{PREFIX}{path}")
            until(page, lambda d: d.execute_script("return document.readyState") == "complete")
            assert "Internal Server Error" not in page.page_source, name
            links = page.execute_script(
                "return [...document.querySelectorAll('a[href], form[action]')]"
                ".map(e => e.getAttribute('href') || e.getAttribute('action'))"
            )
            own = [link for link in links if link.startswith("/")]
            assert own and all(link.startswith(PREFIX) for link in own), (name, own)
            page.save_screenshot(str(shots / f"{name}.png"))

        # pause from the queue's page: back on that page, paused, the log naming alice
        page.get(f"{url}{PREFIX}/ui/queues/mail")
        css(page, f"form[action='{PREFIX}/ui/queues/pause'] button[type=submit]").click()
        until(
            page, lambda d: "paused" in d.page_source.lower() and "/ui/queues/mail" in d.current_url
        )
        page.save_screenshot(str(shots / "queue-paused.png"))
        assert await conn.fetchval(
            "SELECT paused_at IS NOT NULL FROM pgworker.queues WHERE name = 'mail'"
        )
        page.get(f"{url}{PREFIX}/ui/log")
        until(page, lambda d: "alice" in css(d, "main").text)
        page.save_screenshot(str(shots / "log.png"))

        # a reader: no buttons; a press forged from its page is refused with 403
        page.delete_all_cookies()
        _log_in(page, url, READER)
        page.get(f"{url}{PREFIX}/ui/queues/mail")
        until(page, lambda d: d.execute_script("return document.readyState") == "complete")
        posts = page.execute_script(
            "return [...document.querySelectorAll('form[method=post]')]"
            ".map(f => f.getAttribute('action'))"
        )
        assert posts == [f"{PREFIX}/ui/logout"], posts
        refused = page.execute_async_script(
            """const done = arguments[arguments.length - 1];
            const csrf = document.querySelector("input[name=csrf]");
            const body = new URLSearchParams({queue: "mail", csrf: csrf ? csrf.value : ""});
            fetch(arguments[0], {method: "POST", body, credentials: "same-origin"})
              .then(r => done(r.status), e => done(String(e)));""",
            f"{PREFIX}/ui/queues/resume",
        )
        assert refused == 403
        page.save_screenshot(str(shots / "reader-queue.png"))
    assert await conn.fetchval(
        "SELECT paused_at IS NOT NULL FROM pgworker.queues WHERE name = 'mail'"
    )
    actors = [r["actor"] for r in await conn.fetch("SELECT actor FROM pgworker.operator_log")]
    assert actors == ["alice"]
