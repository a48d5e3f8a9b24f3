"""How the console looks, in Debian's headless Chromium against a real `pgworker serve` and a
real database seeded with a day of traffic: dark under `prefers-color-scheme: dark` and by the
theme toggle (kept in a cookie, drawn by the server: no flash); at 1280 px no header or job id
broken mid-word; at 390x844 no page scrolls sideways and the queues page fits a few screens; the
day's wait and run chart has points (it drew none: lone ten-minute buckets between empty ones
made no line, and uPlot hides points that close together). Screenshots of every page in light,
dark and on a phone go to PGWORKER_SCREENSHOTS, else a temporary directory (never committed)."""

from __future__ import annotations

import base64
import itertools
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pgworker._db.queries import queries
from pgworker._web import charts

from .test_dashboard import browser, css, log_in, page, until
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

__all__ = ["browser", "page"]  # the fixtures, imported for this module's tests

q = queries("pgworker")
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
FULL = bool(os.environ.get("PGWORKER_SCREENSHOTS"))
"""Every page whole in each look (else the queues page's look, as the window shows it)."""
PHONE_QUEUES_HEIGHT = 4 * 844
"""The most the queues page may take on a phone with the seeded queues and 20 failures."""


async def _seed_day(conn: Any) -> None:
    """A day of traffic in three queues, three jobs every half hour (waits from 50 ms to
    seconds, runs from 20 ms to a second), rolled up as the maintenance leader would (each
    minute with jobs by stats_rollup.sql, the empty ones marked done); 24 failed jobs whose job
    ids reach five digits, and a queue with a long name."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    await conn.execute("SELECT setval('pgworker.jobs_id_seq', 34000)")
    await conn.execute(
        """
        WITH slots AS (
            SELECT g AS i, $1::timestamptz - g * interval '30 minutes' - interval '3 minutes'
                   AS at
            FROM generate_series(0, 47) AS g
        ), made AS (
            INSERT INTO pgworker.jobs (type, queue, status, attempts, run_at, created_at,
                                       claimed_at, finished_at, error)
            SELECT t.type, t.queue,
                   CASE WHEN (s.i + t.n) % 7 = 0 THEN 'failed' ELSE 'completed' END, 1,
                   s.at, s.at, s.at + interval '1 second', s.at + interval '2 seconds',
                   CASE WHEN (s.i + t.n) % 7 = 0
                        THEN 'TimeoutError: the mail server did not answer in 30 s' || chr(10)
                             || '  File "app/mail.py", line 12, in send' END
            FROM slots AS s
            CROSS JOIN (VALUES (0, 'mail', 'send-invoice'), (1, 'media', 'resize-image'),
                               (2, 'reports-for-the-finance-department-eu-west', 'month-end'))
                AS t(n, queue, type)
            RETURNING id, type, queue, status, created_at
        )
        INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
            correlation_id, outcome, started_at, finished_at, wait_ms, run_ms)
        SELECT m.id, 1, m.type, m.queue, 'w-1', 'c', m.status,
               m.created_at + interval '1 second', m.created_at + interval '2 seconds',
               50 + (m.id % 40) * 60, 20 + (m.id % 9) * 110
        FROM made AS m
        """,
        now,
    )
    minutes = await conn.fetch(
        "SELECT DISTINCT date_bin('1 minute', started_at, 'epoch') AS m FROM pgworker.job_attempts"
    )
    for r in minutes:
        await q.stats_rollup(conn, r["m"], None)
    await conn.execute(
        "INSERT INTO pgworker.stats_rollup (minute, rolled_at, running)"
        " SELECT m, now(), 0 FROM generate_series($1::timestamptz - interval '1 day',"
        " $1::timestamptz - interval '2 minutes', interval '1 minute') AS m"
        " ON CONFLICT DO NOTHING",
        now,
    )


async def test_the_day_chart_has_wait_and_run_times_in_each_bucket(conn):
    await _seed_day(conn)
    day = await charts.stats(conn, q, "day", None, None)
    assert day["unread_minutes"] == 0
    measured = [i for i, v in enumerate(day["wait_p50"]) if v is not None]
    # A job every half hour: every third ten-minute bucket, from the rollup.
    assert len(measured) == 48 and {b - a for a, b in itertools.pairwise(measured)} == {3}
    assert all(day["run_p95"][i] is not None for i in measured)
    assert day["totals"]["enqueued"] == 144


# --- in the browser -------------------------------------------------------------------------------


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path) / "look"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def dark(page: Any) -> Iterator[Any]:
    yield page
    page.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def _background(driver: Any) -> str:
    return str(driver.execute_script("return getComputedStyle(document.body).backgroundColor"))


def _is_dark(rgb: str) -> bool:
    r, g, b = (int(x) for x in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3])
    return (r + g + b) / 3 < 80


MID_WORD = """
// Elements of `selector` whose text takes more lines than it has words: a word broken.
return [...document.querySelectorAll(arguments[0])].filter(el => {
  const words = el.textContent.trim().split(/[\\s-]+/).filter(Boolean);
  if (!words.length || !el.offsetParent) return false;
  const lines = new Set();
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) if (r.width > 0) lines.add(Math.round(r.top));
  }
  return lines.size > words.length;
}).map(el => el.textContent.trim());
"""
WHOLE_WORDS = ".grid th, .card b, .grid a, .badge, [data-live-status]"
"""Headers, ids and counts are short words: a line per word at most (hyphens may end a line);
a line more is a word broken."""

CHART_POINTS = """
// Pixels of the wait/run plot's canvas drawn in a series' colour (not the background, grid,
// axes or text), as uPlot drew them.
const canvas = document.querySelectorAll('[data-chart] canvas')[1];
const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
let drawn = 0;
for (let i = 0; i < data.length; i += 4) {
  const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
  if (a > 200 && Math.max(r, g, b) - Math.min(r, g, b) > 60) drawn++;
}
return drawn;
"""


CONTRAST = """
// The contrast ratio (WCAG) of each pair of the stylesheet's colours, as now applied.
const style = getComputedStyle(document.documentElement);
function luminance(hex) {
  const v = hex.trim().replace('#', '');
  const full = v.length === 3 ? [...v].map(c => c + c).join('') : v;
  return [0, 2, 4].map(i => parseInt(full.slice(i, i + 2), 16) / 255)
    .map(c => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4)
    .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
}
return arguments[0].map(([a, b]) => {
  const [x, y] = [luminance(style.getPropertyValue(a)), luminance(style.getPropertyValue(b))];
  return [a, b, (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05)];
});
"""
TEXT_PAIRS = [
    ("--ink", "--bg"),
    ("--ink", "--panel"),
    ("--muted", "--panel"),
    ("--muted", "--head-bg"),
    ("--accent", "--panel"),
    ("--accent", "--bg"),
    ("--on-accent", "--accent"),
    ("--bad", "--bad-bg"),
    ("--bad", "--panel"),
    ("--good", "--good-bg"),
    ("--warn", "--warn-bg"),
    ("--busy", "--busy-bg"),
    ("--off", "--off-bg"),
    ("--top-ink", "--top"),
]
CHART_PAIRS = [
    (f"--chart-{name}", "--panel") for name in ("enqueued", "completed", "failed", "wait", "run")
]


def _contrast(driver: Any) -> None:
    """Text 4.5:1 at least, the charts' lines 3:1 (WCAG's bounds for text and graphics)."""
    for a, b, ratio in driver.execute_script(CONTRAST, TEXT_PAIRS):
        assert ratio >= 4.5, (a, b, ratio)
    for a, b, ratio in driver.execute_script(CONTRAST, CHART_PAIRS):
        assert ratio >= 3, (a, b, ratio)


def _drawn(driver: Any, window: str) -> None:
    until(driver, lambda d: css(d, "[data-chart]").get_attribute("data-drawn") == window)


def _media(driver: Any, scheme: str) -> None:
    driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )


def _shoot(driver: Any, path: Path) -> None:
    """The whole page, below the fold too, when PGWORKER_SCREENSHOTS asks for them (the docs'
    images are made so); else the queues page's, as the window shows it (a whole long page
    takes seconds)."""
    if not FULL:
        if path.name.startswith("queues-"):
            driver.get_screenshot_as_file(str(path))
        return

    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


async def test_dark_light_whole_words_a_phone_and_the_day_chart(dark, dsn, conn, tmp_path):
    await _seed_day(conn)
    await conn.execute(
        "INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency,"
        " lease, last_seen_at) VALUES ('billing-7f9c4d-x2kqp', 'node-14', 31, '{mail,media}',"
        " '{send-invoice}', 8, 30, now())"
    )
    failed = await conn.fetchval("SELECT max(id) FROM pgworker.jobs WHERE status = 'failed'")
    out = _shots(tmp_path)
    page = dark
    pages = {
        "queues": "/",
        "queue": "/ui/queues/mail",
        "jobs": "/ui/jobs",
        "failed": "/ui/jobs?status=failed",
        "job": f"/ui/jobs/{failed}",
        "workers": "/ui/workers",
        "periodic": "/ui/periodic",
        "log": "/ui/log",
    }
    async with serving(dsn) as served:
        _media(page, "light")
        log_in(page, served)
        _contrast(page)
        for name, path in pages.items():
            page.get(f"{served.url}{path}")
            assert not _is_dark(_background(page)), name
            assert page.execute_script("return document.documentElement.scrollWidth") <= 1280
            if name in ("queues", "queue"):
                _drawn(page, "hour")
                css(page, "button[data-window=day]").click()
                _drawn(page, "day")
                # Buckets every half hour, empty ones between: a point each, not a blank.
                assert page.execute_script(CHART_POINTS) > 100, name
                width = page.execute_script("return document.querySelector('.plot').clientWidth")
                assert width >= 1150, width  # the page's full width (1280 less margins)
            if name == "queues":  # narrowed to one type by its field
                css(page, "input[data-chart-filter=type]").send_keys("month-end\n")
                until(page, lambda d: "48 jobs enqueued" in css(d, "[data-chart-totals]").text)
            _shoot(page, out / f"{name}-light.png")
            broken = page.execute_script(MID_WORD, WHOLE_WORDS)
            assert broken == [], (name, broken)

        # Dark as the system says, until the toggle says otherwise (and the server draws it).
        _media(page, "dark")
        _contrast(page)
        for name, path in pages.items() if FULL else [("queues", "/"), ("job", pages["job"])]:
            page.get(f"{served.url}{path}")
            assert _is_dark(_background(page)), name
            if name in ("queues", "queue"):
                _drawn(page, "hour")
                assert page.execute_script(CHART_POINTS) > 20, name
            _shoot(page, out / f"{name}-dark.png")
        toggle = css(page, "[data-theme-toggle]")
        assert toggle.text == "Theme: auto"
        toggle.click()  # dark, kept
        toggle.click()  # light, kept, though the system says dark
        assert not _is_dark(_background(page))
        page.get(f"{served.url}/ui/workers")
        drawn = page.execute_script("return document.documentElement.getAttribute('data-theme')")
        assert drawn == "light" and not _is_dark(_background(page))
        assert page.get_cookie("pgworker_theme")["path"] == "/"
        _media(page, "light")
        css(page, "[data-theme-toggle]").click()  # auto
        css(page, "[data-theme-toggle]").click()  # dark, though the system says light
        page.get(f"{served.url}/")
        assert _is_dark(_background(page))
        _contrast(page)
        _drawn(page, "hour")
        _shoot(page, out / "queues-dark-toggled.png")
        css(page, "[data-theme-toggle]").click()  # light
        css(page, "[data-theme-toggle]").click()  # auto
        assert page.get_cookie("pgworker_theme") is None

        page.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", PHONE)
        for name, path in pages.items():
            page.get(f"{served.url}{path}")
            wide, shown = page.execute_script(
                "return [document.documentElement.scrollWidth, window.innerWidth]"
            )
            assert shown == 390 and wide <= shown, (name, wide)
            if name in ("queues", "queue"):
                _drawn(page, "hour")
            if name == "queues":
                tall = page.execute_script("return document.documentElement.scrollHeight")
                assert tall <= PHONE_QUEUES_HEIGHT, tall
            _shoot(page, out / f"{name}-phone.png")
