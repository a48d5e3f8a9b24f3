"""The web dashboard of `pgworker serve`, against a real server and a real
database: in Debian's headless Chromium driven by Selenium (log in, see a failed job in seed 001's
words, replay it, see it received then done; a phone's width; escaping; CSRF from another origin)
and over HTTP for what a hostile client sends (forged sessions and tokens, foreign origins, huge
pages, read-only mode). Without /usr/bin/chromium and /usr/bin/chromedriver the browser tests
skip, saying why, except under CI=true, where they fail."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import zipfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

import pgworker

from .helpers import has_status, spawn_worker, status_of, wait_for
from .webserver import Served, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APP = "tests.apps.dashboard"
CSRF = re.compile(r'name="csrf" value="([^"]*)"')
WAIT = 30.0


# --- the browser ----------------------------------------------------------------------------------


def _need_chromium() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        reason = (
            f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver "
            "(.ci/run does)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module's browser tests, its cookies cleared per test."""
    _need_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--force-device-scale-factor=1",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    browser.delete_all_cookies()
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    browser.set_window_size(1280, 900)
    yield browser
    browser.delete_all_cookies()


def until(driver: Any, predicate: Any, timeout: float = WAIT) -> Any:
    """Poll `predicate(driver)` until truthy; a page that reloads itself meanwhile (its elements
    gone stale or not there yet) is polled again."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def settled(driver: Any) -> Any:
        try:
            return predicate(driver)
        except WebDriverException as exc:
            # Chromium's way of saying stale when the page reloads between finding an element
            # and reading it.
            if "does not belong to the document" in str(exc):
                return False
            raise

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(
        settled
    )


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def text_of(driver: Any) -> str:
    return str(css(driver, "body").text)


def log_in(driver: Any, served: Served) -> None:
    """Open the dashboard, meet the login form, give the token once, land on the queues page."""
    driver.get(f"{served.url}/")
    until(driver, lambda d: "/ui/login" in d.current_url)
    css(driver, "#token").send_keys(served.token)
    css(driver, "form[action='/ui/login'] button[type=submit]").click()
    until(driver, lambda d: d.current_url == f"{served.url}/")


# --- servers, workers, HTTP clients ---------------------------------------------------------------


@contextmanager
def worker(dsn: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real `pgworker run tests.apps.dashboard`, stopped with SIGTERM when the block ends."""
    process = spawn_worker(
        APP, dsn, tmp_path / "worker.log", "--poll-interval", "0.1", "--shutdown-timeout", "1"
    )
    try:
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@asynccontextmanager
async def http(served: Served, *, login: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the server's pages holding their cookies, logged in with the token."""
    async with httpx.AsyncClient(base_url=served.url, timeout=WAIT) as client:
        if login:
            form = await client.get("/ui/login")
            answer = await client.post(
                "/ui/login", data={"csrf": csrf_of(form.text), "token": served.token, "next": "/"}
            )
            assert answer.status_code == 303 and answer.headers["location"] == "/"
        yield client


def session_cookie(served: Served, root: str = "") -> str:
    """The name of the session cookie of the console at `served.url` (mounted under `root`)."""
    from urllib.parse import urlsplit

    from pgworker._web.dashboard_session import SESSION_COOKIE, cookie_name

    return cookie_name(SESSION_COOKIE, urlsplit(served.url).netloc, root)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found and found.group(1), "no CSRF token in the page"
    return found.group(1)


async def failed_job(conn: Any, dsn: str, tmp_path: Path, message: str, **payload: Any) -> int:
    """A charge-card job whose first attempt failed for good with `message`."""
    r = await pgworker.enqueue(conn, "charge-card", {"message": message, **payload})
    with worker(dsn, tmp_path):
        await wait_for(lambda: has_status(conn, r.job.id, "failed"), timeout=WAIT)
    return r.job.id


# --- the browser tests ----------------------------------------------------------------------------


async def test_log_in_see_a_failed_job_replay_it_and_see_it_received_then_done(
    page, dsn, conn, tmp_path
):
    job_id = await failed_job(conn, dsn, tmp_path, "card declined: insufficient funds", amount=4200)
    async with serving(dsn) as served:
        log_in(page, served)
        assert "1\nneed attention" in text_of(page)
        css(page, f"a[href='/ui/jobs/{job_id}']").click()
        until(page, lambda d: d.current_url == f"{served.url}/ui/jobs/{job_id}")

        badge = css(page, ".jobhead .badge")
        assert badge.text == "needs attention · failed"
        said = css(page, ".said").text
        assert "did not complete after 1 attempt" in said and "replay" in said
        # The technical error is one click away, not on the page's face.
        error = css(page, "details.error pre")
        assert not error.is_displayed()
        css(page, "details.error summary").click()
        assert error.is_displayed()
        assert "card declined: insufficient funds" in error.text
        assert "Attempt 1: failed, final" in text_of(page)

        css(page, "form[action$='/replay'] button").click()
        until(page, lambda d: "put back in its queue" in text_of(d))
        # Received, waiting: no worker runs, so nothing may claim success yet.
        assert css(page, ".jobhead .badge").text == "received — waiting for a worker · pending"
        assert await status_of(conn, job_id) == "pending"
        assert "done" not in css(page, ".jobhead").text

        with worker(dsn, tmp_path):
            # The page of a job not finished refreshes itself: no reload here.
            until(page, lambda d: css(d, ".jobhead .badge").text == "done · completed")
        assert await status_of(conn, job_id) == "completed"
        body = text_of(page)
        first, replayed, second = (
            body.index(t) for t in ("Attempt 1: failed", "Replayed by dashboard", "Attempt 2: done")
        )
        assert first < replayed < second and "charged" in body
        assert "put back in its queue" not in body  # the flash is shown once


async def test_no_horizontal_scroll_on_a_phone_and_a_table_at_1280_px(page, dsn, conn, tmp_path):
    long_type = "reconcile-" + "x" * 190
    job_id = await failed_job(conn, dsn, tmp_path, "E" * 400, blob="y" * 3000)
    await pgworker.enqueue(conn, long_type, {"note": "z" * 2000}, queue="q" * 63)
    await conn.execute(
        "INSERT INTO pgworker.periodic (name, type, schedule, next_slot)"
        " VALUES ($1, $2, $3, now())",
        "nightly-" + "n" * 190,
        long_type,
        "cron 0 3 * * * America/Argentina/ComodRivadavia",
    )
    async with serving(dsn) as served:
        log_in(page, served)
        paths = [
            "/",
            "/ui/jobs",
            f"/ui/jobs/{job_id}",
            "/ui/workers",
            "/ui/jobs?status=failed",
            "/ui/periodic",
        ]
        for path in paths:
            page.get(f"{served.url}{path}")
            assert page.execute_script("return document.documentElement.scrollWidth") <= 1280
        page.get(f"{served.url}/ui/jobs")
        assert css(page, "table.grid thead").is_displayed()

        page.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True},
        )
        for path in paths:
            page.get(f"{served.url}{path}")
            wide, shown = page.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]"
            )
            assert shown == 390
            assert wide <= shown, f"{path} scrolls sideways at 390 px ({wide} px wide)"
        page.get(f"{served.url}/ui/jobs")
        assert not css(page, "table.grid thead").is_displayed()  # rows become cards
        assert long_type in text_of(page)


async def test_markup_in_a_type_payload_and_error_is_shown_as_text(page, dsn, conn, tmp_path):
    script = "<script>window.pwned = 1</script>"
    image = "<img src=x onerror='window.pwned = 2'>"
    job_id = await failed_job(conn, dsn, tmp_path, f"{script}{image}", note=image)
    other = await pgworker.enqueue(conn, script, {"x": script}, queue="q", correlation_id=image)
    async with serving(dsn) as served:
        log_in(page, served)
        for path in [
            "/",
            f"/ui/jobs/{job_id}",
            f"/ui/jobs/{other.job.id}",
            "/ui/jobs",
            f"/ui/jobs?type={script}",
        ]:
            page.get(f"{served.url}{path}")
            for summary in page.find_elements("css selector", "details summary"):
                summary.click()
            assert page.execute_script("return window.pwned") is None
            assert not page.find_elements("css selector", "main script, main img")
        page.get(f"{served.url}/ui/jobs/{job_id}")
        css(page, "details.error summary").click()
        assert script in css(page, "details.error pre").text
        page.get(f"{served.url}/ui/jobs/{other.job.id}")
        assert script in css(page, ".jobhead h1").text
        assert image in text_of(page)


async def test_a_form_of_another_origin_cannot_press_a_button(page, dsn, conn, tmp_path):
    """Another server of the same host (same site: the session cookie goes along) posts the
    replay form: without this session's CSRF token it is refused and nothing changes."""
    job_id = await failed_job(conn, dsn, tmp_path, "declined")
    async with serving(dsn) as served, foreign_page(served, job_id) as foreign:
        log_in(page, served)
        for button in ("no-token", "forged-token"):
            page.get(foreign)
            css(page, f"#{button}").click()
            until(page, lambda d: "Request refused" in text_of(d))
            assert page.current_url.startswith(served.url)
        assert await status_of(conn, job_id) == "failed"
        page.get(f"{served.url}/ui/jobs/{job_id}")
        assert css(page, ".jobhead .badge").text == "needs attention · failed"


@asynccontextmanager
async def foreign_page(served: Served, job_id: int) -> AsyncIterator[str]:
    """A page on another port of 127.0.0.1 holding forms that POST to the dashboard."""
    target = f"{served.url}/ui/jobs/{job_id}/replay"
    html = (
        "<!doctype html><title>win a prize</title>"
        f"<form method=post action='{target}'><button id=no-token>Go</button></form>"
        f"<form method=post action='{target}'><input type=hidden name=csrf value=AAAA>"
        "<button id=forged-token>Go</button></form>"
    ).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


async def test_the_session_cookie_is_http_only_and_same_site_strict(page, dsn):
    async with serving(dsn) as served:
        log_in(page, served)
        cookie = page.get_cookie(session_cookie(served))
        assert cookie is not None
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert "pgworker_session" not in page.execute_script("return document.cookie")
        assert served.token not in cookie["value"]


async def test_screenshots_of_the_queue_page_and_of_a_job_page(page, dsn, conn, tmp_path):
    """With realistic jobs in three queues. PGWORKER_SCREENSHOTS=docs/screenshots writes the
    README's images; otherwise they go to a temporary directory and are only checked."""
    out = _folder(Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path))
    charge = await failed_job(
        conn,
        dsn,
        tmp_path,
        "card declined by the issuer (insufficient funds)",
        order="A-1042",
        amount=12900,
        card_token="tok_4242424242424242",
    )
    await pgworker.replay(conn, [charge], by="alice", reason="customer topped up the card")
    declined = await failed_job(
        conn, dsn, tmp_path, "card expired in 2026-10", order="A-1057", amount=4500
    )
    for n in range(6):
        await pgworker.enqueue(conn, "send-invoice", {"invoice_id": 3300 + n}, queue="mail")
    await pgworker.enqueue(conn, "resize-image", {"image": "p/811.jpg"}, queue="media")
    await pgworker.enqueue(conn, "sync-crm", {"account": 77}, queue="default")
    for n in range(3):
        await pgworker.enqueue(
            conn, "send-invoice", {"invoice_id": 3400 + n}, queue="mail", delay=3600
        )
    with worker(dsn, tmp_path):
        await wait_for(lambda: has_status(conn, charge, "completed"), timeout=WAIT)
        await wait_for(lambda: _running(conn, "resize-image"), timeout=WAIT)
        await wait_for(lambda: _retrying(conn, "sync-crm"), timeout=WAIT)
        await wait_for(lambda: _done(conn, "send-invoice", 6), timeout=WAIT)
        async with serving(dsn) as served:
            log_in(page, served)
            shots = {"queues.png": "/", "job.png": f"/ui/jobs/{charge}"}
            for name, path in shots.items():
                page.get(f"{served.url}{path}")
                height = page.execute_script("return document.documentElement.scrollHeight")
                height = min(max(height, 720), 2000)
                _viewport(page, 1280, height)
                page.get(f"{served.url}{path}")
                _save(out / name, page.get_screenshot_as_png())
            _viewport(page, 1280, 900)
    assert declined
    for name in ("queues.png", "job.png"):
        width, height = _png_size(out / name)
        assert width == 1280 and height >= 720


def _viewport(driver: Any, width: int, height: int) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _save(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def _running(conn: Any, type_: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE type = $1 AND status = 'running'", type_
        )
    )


async def _retrying(conn: Any, type_: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE type = $1 AND status = 'pending' "
            "AND error IS NOT NULL",
            type_,
        )
    )


async def _done(conn: Any, type_: str, n: int) -> bool:
    done = await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE type = $1 AND status = 'completed'", type_
    )
    return bool(done >= n)


# --- over HTTP: what a hostile client sends -------------------------------------------------------


async def test_every_page_needs_a_login_and_a_wrong_token_is_refused(dsn):
    async with serving(dsn) as served, http(served, login=False) as client:
        for path in [
            "/",
            "/ui/jobs",
            "/ui/jobs/1",
            "/ui/workers",
            "/ui/jobs?status=failed",
            "/ui/periodic",
        ]:
            answer = await client.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/ui/login?next=")
        # The API's bearer token does not open a page: a browser logs in.
        answer = await client.get("/", headers={"Authorization": f"Bearer {served.token}"})
        assert answer.status_code == 303
        form = await client.get("/ui/login")
        assert form.status_code == 200
        for wrong in ["", "nope", served.token + "x", served.token[:-1]]:
            answer = await client.post(
                "/ui/login", data={"csrf": csrf_of(form.text), "token": wrong, "next": "/"}
            )
            assert answer.status_code == 401
            assert "This token is not accepted" in answer.text
            assert "pgworker_session" not in answer.headers.get("set-cookie", "") or (
                '"auth":true' not in _session_payload(answer.headers["set-cookie"])
            )
            assert (await client.get("/")).status_code == 303
        # The login form itself carries a CSRF token: a login posted from elsewhere is refused.
        answer = await client.post("/ui/login", data={"token": served.token})
        assert answer.status_code == 403


def _session_payload(set_cookie: str) -> str:
    found = re.search(r"pgworker_session_[0-9a-f]+=([^.;]+)\.", set_cookie)
    if not found:
        return ""
    text = found.group(1)
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


async def test_a_forged_or_altered_session_is_no_session(dsn):
    async with serving(dsn) as served, http(served, login=False) as client:
        await client.get("/ui/login")
        anonymous = client.cookies[session_cookie(served)]
        payload, signature = anonymous.split(".")
        value = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        value["auth"] = True
        raised = base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")
        forged = [
            f"{raised}.{signature}",  # logged in by its own say-so
            anonymous,  # the login form's session, not logged in
            f"{payload}.{signature[:-2]}AA",
            "e30.",
            "x" * 5000,
            "not a cookie",
        ]
        for cookie in forged:
            client.cookies.clear()
            client.cookies.set(session_cookie(served), cookie)
            answer = await client.get("/")
            assert answer.status_code == 303, cookie[:40]
            assert answer.headers["location"].startswith("/ui/login")


async def test_a_session_from_another_server_is_no_session(dsn):
    """The signing secret is drawn per server: a restart (or another server) logs people out."""
    async with serving(dsn) as first, http(first) as client:
        cookie = client.cookies[session_cookie(first)]
        assert (await client.get("/")).status_code == 200
    async with serving(dsn) as second, http(second, login=False) as client:
        client.cookies.set(session_cookie(second), cookie)
        assert (await client.get("/")).status_code == 303


async def test_a_button_needs_its_session_csrf_token_and_origin(dsn, conn):
    r = await pgworker.enqueue(conn, "charge-card", {})
    job_id = r.job.id
    async with serving(dsn) as served, http(served) as client:
        token = csrf_of((await client.get(f"/ui/jobs/{job_id}")).text)
        refused = [
            ({}, {}),
            ({"csrf": ""}, {}),
            ({"csrf": token[:-1] + ("A" if token[-1] != "A" else "B")}, {}),
            ({"csrf": token}, {"Origin": "http://evil.example"}),
            ({"csrf": token}, {"Origin": "null"}),
            ({"csrf": token}, {"Sec-Fetch-Site": "cross-site"}),
            ({"csrf": token}, {"Sec-Fetch-Site": "same-site"}),
        ]
        for data, headers in refused:
            answer = await client.post(f"/ui/jobs/{job_id}/cancel", data=data, headers=headers)
            assert answer.status_code == 403, (data, headers)
            assert await status_of(conn, job_id) == "pending"
        # Another session's token does not do either.
        async with http(served) as other:
            answer = await other.post(f"/ui/jobs/{job_id}/cancel", data={"csrf": token})
            assert answer.status_code == 403
        assert await status_of(conn, job_id) == "pending"
        answer = await client.post(
            f"/ui/jobs/{job_id}/cancel",
            data={"csrf": token},
            headers={"Origin": "http://evil.example", "X-Forwarded-Host": "other.example"},
        )
        assert answer.status_code == 403
        # Behind a proxy that passes the browser's host on.
        answer = await client.post(
            f"/ui/jobs/{job_id}/cancel",
            data={"csrf": token},
            headers={"Origin": "https://jobs.example", "X-Forwarded-Host": "jobs.example"},
        )
        assert answer.status_code == 303
        assert await status_of(conn, job_id) == "cancelled"


async def test_replay_and_cancel_say_what_really_happened(dsn, conn):
    pending = (await pgworker.enqueue(conn, "charge-card", {})).job.id
    async with serving(dsn) as served, http(served) as client:

        async def press(action: str, job_id: int) -> str:
            token = csrf_of((await client.get(f"/ui/jobs/{job_id}")).text)
            answer = await client.post(f"/ui/jobs/{job_id}/{action}", data={"csrf": token})
            assert answer.status_code == 303
            assert answer.headers["location"] == f"/ui/jobs/{job_id}"
            return (await client.get(f"/ui/jobs/{job_id}")).text

        shown = await press("replay", pending)
        assert f"Job {pending} was not replayed: it is received" in shown
        assert await status_of(conn, pending) == "pending"
        shown = await press("cancel", pending)
        assert f"Job {pending} was cancelled before it ran" in shown
        assert await status_of(conn, pending) == "cancelled"
        shown = await press("cancel", pending)
        assert f"Job {pending} was not cancelled: it is already cancelled" in shown
        shown = await press("replay", pending)
        assert f"Job {pending} was put back in its queue" in shown
        assert await status_of(conn, pending) == "pending"
        # The message is shown once, and only to the session that pressed.
        assert "put back in its queue" not in (await client.get(f"/ui/jobs/{pending}")).text

        await conn.execute(
            "UPDATE pgworker.jobs SET status = 'running', attempts = 1, claimed_at = now(), "
            "worker_id = 'w', lease_expires_at = now() + interval '1 hour' WHERE id = $1",
            pending,
        )
        shown = await press("replay", pending)
        assert "was not replayed: it is in progress" in shown
        shown = await press("cancel", pending)
        assert "Cancel requested" in shown and "cancelled before" not in shown
        assert await status_of(conn, pending) == "running"

        token = csrf_of((await client.get("/ui/jobs")).text)
        for bad in ["0", "-1", "abc", "1e3", str(2**63), "99999"]:
            answer = await client.post(f"/ui/jobs/{bad}/replay", data={"csrf": token})
            assert answer.status_code == 404, bad


async def test_read_only_hides_the_buttons_and_refuses_their_posts(dsn, conn, tmp_path):
    job_id = await failed_job(conn, dsn, tmp_path, "declined")
    async with serving(dsn, "--read-only") as served, http(served) as client:
        shown = await client.get(f"/ui/jobs/{job_id}")
        assert shown.status_code == 200
        assert "/replay" not in shown.text and "/cancel" not in shown.text
        assert "Read-only" in shown.text
        assert "/replay" not in (await client.get("/")).text
        for action in ("replay", "cancel"):
            answer = await client.post(
                f"/ui/jobs/{job_id}/{action}", data={"csrf": csrf_of(shown.text)}
            )
            assert answer.status_code == 405
        assert await status_of(conn, job_id) == "failed"


async def test_insecure_no_auth_opens_the_pages_but_still_checks_csrf(dsn, conn, tmp_path):
    job_id = await failed_job(conn, dsn, tmp_path, "declined")
    async with serving(dsn, "--insecure-no-auth", token=None) as served:
        async with http(served, login=False) as client:
            shown = await client.get(f"/ui/jobs/{job_id}")
            assert shown.status_code == 200 and "needs attention" in shown.text
            assert (await client.get("/ui/login")).headers["location"] == "/"
            answer = await client.post(f"/ui/jobs/{job_id}/replay", data={})
            assert answer.status_code == 403
            assert await status_of(conn, job_id) == "failed"
            answer = await client.post(
                f"/ui/jobs/{job_id}/replay", data={"csrf": csrf_of(shown.text)}
            )
            assert answer.status_code == 303
        assert await status_of(conn, job_id) == "pending"


async def test_filters_and_keyset_pages(dsn, conn):
    ids = [
        (await pgworker.enqueue(conn, "a" if n % 2 else "b", {"n": n}, queue="q1")).job.id
        for n in range(130)
    ]
    tagged = await pgworker.enqueue(conn, "c", {}, queue="q2", correlation_id="order-77")
    async with serving(dsn) as served, http(served) as client:
        seen: list[int] = []
        url = "/ui/jobs?queue=q1"
        while url:
            answer = await client.get(url)
            assert answer.status_code == 200
            seen += [
                int(i)
                for i in re.findall(r'<td data-label="Job"><a href="/ui/jobs/(\d+)"', answer.text)
            ]
            older = re.search(r'<a href="([^"]+)">Older', answer.text)
            url = older.group(1).replace("&amp;", "&") if older else ""
        assert seen == sorted(ids, reverse=True)  # every job once, newest first, in 3 pages

        answer = await client.get("/ui/jobs?type=a&limit=200")
        found = {int(i) for i in re.findall(r'href="/ui/jobs/(\d+)"', answer.text)}
        assert found == set(ids[1::2])
        answer = await client.get("/ui/jobs?correlation_id=order-77")
        assert set(re.findall(r'href="/ui/jobs/(\d+)"', answer.text)) == {str(tagged.job.id)}
        answer = await client.get("/ui/jobs?status=completed")
        assert "No job matches." in answer.text

        for bad in [
            "status=done",
            "limit=0",
            "limit=100000",
            "before=-1",
            "before=abc",
            f"before={2**63}",
            "type=" + "t" * 201,
            "queue=" + "q" * 64,
            "correlation_id=%00",
        ]:
            answer = await client.get(f"/ui/jobs?{bad}")
            assert answer.status_code == 400, bad
            assert bad.split("=")[0] in answer.text


async def test_a_huge_payload_is_cut_on_its_page(dsn, conn):
    big = await pgworker.enqueue(conn, "charge-card", {"blob": "x" * 2_000_000})
    async with serving(dsn) as served, http(served) as client:
        answer = await client.get(f"/ui/jobs/{big.job.id}")
        assert answer.status_code == 200
        assert len(answer.content) < 400_000
        assert "(cut: 2,000,0" in answer.text
        listed = await client.get("/ui/jobs")
        assert len(listed.content) < 50_000  # the list never reads payloads

        # A job that snoozed 1,000 times: its page lists the latest 200 attempts.
        snoozer = await pgworker.enqueue(conn, "poll-feed", {})
        await conn.execute(
            "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, "
            "correlation_id, outcome, started_at, finished_at) "
            "SELECT $1, n, 'poll-feed', 'default', 'w', 'c', 'snoozed', "
            "now() - (1001 - n) * interval '1 minute', now() - (1001 - n) * interval '1 minute' "
            "FROM generate_series(1, 1000) AS n",
            snoozer.job.id,
        )
        await conn.execute("UPDATE pgworker.jobs SET attempts = 1000 WHERE id = $1", snoozer.job.id)
        shown = (await client.get(f"/ui/jobs/{snoozer.job.id}")).text
        assert shown.count("Attempt ") == 200
        assert "800 earlier entries not shown" in shown
        assert "Attempt 1000: snoozed" in shown and "Attempt 800:" not in shown


async def test_workers_their_running_jobs_heartbeats_and_jobs_past_their_lease(dsn, conn, tmp_path):
    busy = await pgworker.enqueue(conn, "resize-image", {}, queue="media")
    waiting = await pgworker.enqueue(conn, "no-one-serves-this", {}, queue="media")
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency, "
        "last_seen_at) VALUES ('frozen-1', 'host-b', 42, '{media}', '{x}', 4, "
        "now() - interval '5 minutes')"
    )
    with worker(dsn, tmp_path):
        await wait_for(lambda: has_status(conn, busy.job.id, "running"), timeout=WAIT)
        holder = await conn.fetchval(
            "SELECT worker_id FROM pgworker.jobs WHERE id = $1", busy.job.id
        )
        async with serving(dsn) as served, http(served) as client:
            shown = (await client.get("/ui/workers")).text
            row = shown[shown.index(holder) :]
            row = row[: row.index("</tr>")]
            assert f'href="/ui/jobs/{busy.job.id}"' in row
            assert "not seen for" not in row
            frozen = shown[shown.index("frozen-1") :]
            assert "not seen for 5 min" in frozen[: frozen.index("</tr>")]
            queues = (await client.get("/")).text
            assert "No live worker serves" in queues and "no-one-serves-this" in queues
            assert "Running past their lease" not in queues
            await conn.execute(
                "UPDATE pgworker.jobs SET status = 'running', attempts = 1, claimed_at = now(), "
                "worker_id = 'frozen-1', lease_expires_at = now() - interval '2 minutes' "
                "WHERE id = $1",
                waiting.job.id,
            )
            queues = (await client.get("/")).text
            past = queues[queues.index("Running past their lease") :]
            assert f'href="/ui/jobs/{waiting.job.id}"' in past and "frozen-1" in past


async def test_login_goes_back_to_the_page_asked_for_and_nowhere_else(dsn):
    async with serving(dsn) as served, http(served, login=False) as client:
        first = await client.get("/ui/jobs?status=failed")
        assert first.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%3Fstatus%3Dfailed"
        for asked, landing in [
            ("/ui/jobs?status=failed", "/ui/jobs?status=failed"),
            ("//evil.example/", "/"),
            ("https://evil.example/", "/"),
            ("/\\evil.example", "/"),
        ]:
            client.cookies.clear()
            form = await client.get("/ui/login", params={"next": asked})
            answer = await client.post(
                "/ui/login", data={"csrf": csrf_of(form.text), "token": served.token, "next": asked}
            )
            assert answer.status_code == 303 and answer.headers["location"] == landing


async def test_pages_send_security_headers_and_say_when_the_schema_is_missing(dsn, conn):
    async with serving(dsn) as served, http(served) as client:
        answer = await client.get("/")
        assert "default-src 'none'" in answer.headers["content-security-policy"]
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["cache-control"] == "no-store"
        css_file = await client.get("/ui/static/dashboard.css")
        assert css_file.status_code == 200 and "@media" in css_file.text
        # The dashboard is not part of the API's OpenAPI document.
        document = (await served.client().get("/openapi.json")).json()
        assert not any(p == "/" or p.startswith("/ui") for p in document["paths"])
        await conn.execute("ALTER SCHEMA pgworker RENAME TO pgworker_away")
        try:
            answer = await client.get("/")
        finally:
            await conn.execute("ALTER SCHEMA pgworker_away RENAME TO pgworker")
        assert answer.status_code == 503
        assert "pgworker migrate" in answer.text and "Traceback" not in answer.text


async def test_the_wheel_carries_the_templates_and_the_stylesheet(tmp_path):
    shipped, wanted = _wheel_and_web_files(tmp_path)
    assert wanted and wanted <= shipped
    assert {f"pgworker/sql/queries/dashboard_{n}.sql" for n in ("workers", "overdue")} <= shipped
    # The job lists' query and its filter, a fragment.
    assert {f"pgworker/sql/queries/{n}.sql" for n in ("jobs_filtered", "_job_filter")} <= shipped


def _wheel_and_web_files(tmp_path: Path) -> tuple[set[str], set[str]]:
    """The files of a wheel built from the checkout, and the dashboard's templates and static
    files in the checkout."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    web = ROOT / "pgworker" / "_web"
    wanted = {
        p.relative_to(ROOT).as_posix()
        for folder in ("templates", "static")
        for p in (web / folder).rglob("*")
        if p.is_file()  # static/vendor/uplot/ too
    }
    return shipped, wanted


async def test_unicode_digits_in_filters_get_the_bad_filter_page(dsn, conn):
    """`str.isdigit` says yes to `²` and `⁹`, which `int()` then refuses (a JSON 500 and a
    traceback), and `int()` takes fullwidth and Arabic-Indic digits: every number in a URL is
    ASCII digits, else the "Bad filter" page, as for `limit=abc`. Plain HTTP, no browser."""
    job = await pgworker.enqueue(conn, "charge-card", {})
    async with serving(dsn) as served, http(served) as client:
        plain = await client.get("/ui/jobs?limit=abc")
        assert plain.status_code == 400 and "Bad filter" in plain.text
        for bad in [
            "limit=²",
            "before=⁹",
            "limit=\uff11",
            "before=\u0663",
            "limit=1_0",
            "limit=%2B5",
            "before=1.0",
        ]:
            answer = await client.get(f"/ui/jobs?{bad}")
            assert answer.status_code == plain.status_code, (bad, answer.text[:300])
            assert "Bad filter" in answer.text and bad.split("=")[0] in answer.text, bad
        for bad in ["\u0661", "\uff11", "²"]:
            assert (await client.get(f"/ui/jobs/{bad}")).status_code == 404, bad
        assert (await client.get(f"/ui/jobs?before={job.job.id + 1}&limit=5")).status_code == 200
        assert "Traceback" not in served.stderr()
