"""The console's job lists people act on, and its job forms, in a real Chromium against a real
`pgworker serve` (uvicorn) and database: tick five rows and cancel them; "select all matching"
over 2,000 jobs, the bulk action covering all of them; sort by run time (a stable order, an
allow-list); the state of a job parked on an event, in a paused queue or held by a full limit;
edit a pending job's run at and payload (a typed task's bad payload refused, the field named);
enqueue a typed job from the form drawn from its payload schema; a `read` operator refused (403)
and the forms' CSRF checked; markup in a type or payload shown as text.
Screenshots go to PGWORKER_SCREENSHOTS, else a temporary directory (never committed)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import pgworker

from .helpers import wait_for
from .test_dashboard import browser, csrf_of, css, page, text_of, until
from .webserver import Served, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["browser", "page"]  # the fixtures, used by name

ALICE = "alice-token-0123456789abcdef"
READER = "reader-token-0123456789abcdef"
OPERATORS = {"PGWORKER_TOKENS": f"alice:{ALICE}:operate,reader:{READER}:read"}


def _shots(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PGWORKER_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _log_in(driver: Any, served: Served, token: str) -> None:
    driver.get(f"{served.url}/ui/login")
    css(driver, "#token").send_keys(token)
    css(driver, "form[action='/ui/login'] button[type=submit]").click()
    until(driver, lambda d: d.current_url == f"{served.url}/")


@asynccontextmanager
async def _client(served: Served, token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the pages holding their cookies, logged in as the operator of `token`."""
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        form = await client.get("/ui/login")
        answer = await client.post(
            "/ui/login", data={"csrf": csrf_of(form.text), "token": token, "next": "/"}
        )
        assert answer.status_code == 303, answer.text
        yield client


async def _seed(conn: Any, n: int, queue: str) -> list[int]:
    rows = await conn.fetch(
        "INSERT INTO pgworker.jobs (type, queue, payload) "
        "SELECT 'tidy-up', $1, jsonb_build_object('n', g) FROM generate_series(1, $2) AS g "
        "RETURNING id",
        queue,
        n,
    )
    return [r["id"] for r in rows]


async def _ran(conn: Any, ids: list[int], run_ms: list[float | None]) -> None:
    """Each job of `ids` completed after one attempt that ran `run_ms` (None: never ran)."""
    for job_id, ms in zip(ids, run_ms, strict=True):
        if ms is None:
            continue
        await conn.execute(
            "UPDATE pgworker.jobs SET status = 'completed', attempts = 1, finished_at = now() "
            "WHERE id = $1",
            job_id,
        )
        await conn.execute(
            "INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, correlation_id, "
            "worker_id, outcome, finished_at, run_ms) SELECT id, 1, type, queue, "
            "correlation_id, 'w1', 'completed', now(), $2 FROM pgworker.jobs WHERE id = $1",
            job_id,
            ms,
        )


def _shown_ids(driver: Any) -> list[int]:
    links = driver.find_elements("css selector", "table.jobs td[data-label=Job] a")
    return [int(a.text.lstrip("#")) for a in links]


async def test_tick_rows_select_all_matching_sort_and_see_what_holds_a_job(
    page: Any, dsn: str, conn: Any, tmp_path: Path
) -> None:
    out = _shots(tmp_path)
    mass = await _seed(conn, 2000, "mass")
    few = await _seed(conn, 8, "few")
    # run times: ties broken by id, never-run jobs last whichever the direction
    await _ran(conn, few, [120.0, 5.0, 120.0, None, 900.0, 30.0, None, 5.0])
    # longest first, ties by id the same way, the jobs that never ran last either way
    longest = [few[i] for i in (4, 2, 0, 5, 7, 1, 6, 3)]
    shortest = [few[i] for i in (1, 7, 5, 0, 2, 4, 3, 6)]
    # what holds a waiting job back: an event, a paused queue, a full limit
    (parked,) = await _seed(conn, 1, "events")
    deadline = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    await conn.execute(
        "UPDATE pgworker.jobs SET run_at = $2, attempts = 1 WHERE id = $1", parked, deadline
    )
    await conn.execute(
        "INSERT INTO pgworker.job_event_waits (job_id, seq, name, deadline, attempt) "
        "VALUES ($1, 1, 'invoice-paid', $2, 1)",
        parked,
        deadline,
    )
    await _seed(conn, 1, "stopped")
    await _seed(conn, 2, "narrow")
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'running', lease_expires_at = now() + interval '1 h' "
        "WHERE id = (SELECT min(id) FROM pgworker.jobs WHERE queue = 'narrow')"
    )
    await conn.execute(
        "INSERT INTO pgworker.queues (name, paused_at, paused_by) VALUES ('stopped', now(), 'x')"
    )
    await conn.execute("INSERT INTO pgworker.queues (name, max_running) VALUES ('narrow', 1)")
    async with serving(dsn) as served:
        _log_in(page, served, served.token)
        page.get(f"{served.url}/ui/jobs?status=pending")
        states = text_of(page)
        assert "waits for event invoice-paid until 2030-01-02 03:04:05 UTC" in states
        assert "scheduled for 2030" not in states
        assert "paused queue" in states
        assert "held by limit: at most 1 running in queue narrow" in states
        page.save_screenshot(str(out / "list-states.png"))

        # sort by run time: longest first, then shortest first; ties by id; NULLs last
        page.get(f"{served.url}/ui/jobs?queue=few")
        css(page, "th a.sort[href*='sort=run_time']").click()
        until(page, lambda d: "sort=run_time" in d.current_url)
        assert _shown_ids(page) == longest
        assert css(page, "th[aria-sort=descending] a").get_attribute("href").endswith("asc")
        css(page, "th a.sort[href*='sort=run_time']").click()
        until(page, lambda d: "order=asc" in d.current_url)
        assert _shown_ids(page) == shortest
        page.save_screenshot(str(out / "list-sorted.png"))
        # three at a time, the pages walk the same order: no row twice, none left out
        walked: list[int] = []
        page.get(f"{served.url}/ui/jobs?queue=few&sort=run_time&order=asc&limit=3")
        while True:
            walked += _shown_ids(page)
            nexts = page.find_elements("css selector", "nav.pages a[href*='after=']")
            if not nexts:
                break
            nexts[0].click()
        assert walked == shortest

        # tick five rows, cancel them
        page.get(f"{served.url}/ui/jobs?queue=mass")
        boxes = page.find_elements("css selector", "input[name=ids]")[:5]
        chosen = [int(b.get_attribute("value")) for b in boxes]
        for box in boxes:
            box.click()
        assert css(page, "#chosen").text == "5 jobs selected."
        css(page, "#selection button[value=cancel]").click()
        until(page, lambda d: "/ui/jobs/actions/new" in d.current_url)
        assert css(page, "#matched").text == "5"
        css(page, "form.bulk button[type=submit]").click()
        until(page, lambda d: css(d, "#progress"))  # the progress page; the runner does the rest
        await wait_for(lambda: _all_done(conn), timeout=30)
        cancelled = await conn.fetch(
            "SELECT id FROM pgworker.jobs WHERE status = 'cancelled' ORDER BY id"
        )
        assert [r["id"] for r in cancelled] == sorted(chosen)

        # every job of the page, then all 2,000 matching the filter
        page.get(f"{served.url}/ui/jobs?queue=mass")
        css(page, "#tick-page").click()
        offer = until(
            page, lambda d: css(d, "#select-all").is_displayed() and css(d, "#select-all")
        )
        assert offer.text == "Select all 2,000 jobs matching this filter"
        offer.click()
        assert "All 2,000 jobs matching this filter are selected" in css(page, "#chosen").text
        page.save_screenshot(str(out / "list-all-matching.png"))
        css(page, "#selection button[value=cancel]").click()
        until(page, lambda d: "/ui/jobs/actions/new" in d.current_url)
        assert css(page, "#matched").text == "2,000"
        css(page, "form.bulk button[type=submit]").click()
        until(page, lambda d: css(d, "#progress"))
        await wait_for(lambda: _all_done(conn), timeout=60)
        await _refusals(served, conn, few)
    # ticked five, all 2,000 matching (those five skipped: already cancelled), the API's two
    actions = await conn.fetch(
        "SELECT matched, done, skipped FROM pgworker.bulk_actions ORDER BY id"
    )
    assert [tuple(a) for a in actions] == [(5, 5, 0), (2000, 1995, 5), (2, 2, 0)]
    assert await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE queue = 'mass' AND status = 'cancelled'"
    ) == len(mass)
    # and the API's selection: the two jobs it named (ids), no other
    assert [
        r["id"]
        for r in await conn.fetch(
            "SELECT id FROM pgworker.jobs WHERE queue <> 'mass' AND status = 'cancelled' "
            "ORDER BY id"
        )
    ] == sorted([few[3], few[6]])


async def _all_done(conn: Any) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) > 0 AND bool_and(state = 'done') FROM pgworker.bulk_actions"
        )
    )


async def _refusals(served: Served, conn: Any, few: list[int]) -> None:
    """Sorting is an allow-list (never SQL from the URL), a page's start is checked, an empty
    selection is refused rather than read as every job, and the API's `ids` is bounded (422
    naming filter.ids), then acts on the ids it names only."""
    async with _client(served, served.token) as client:
        for query, field in [
            ("sort=id;DROP TABLE pgworker.jobs", "sort"),
            ("sort=created&order=sideways", "order"),
            ("sort=created&after=x|1", "after"),
            ("after=1|1", "after"),
        ]:
            answer = await client.get(f"/ui/jobs?{query}")
            assert answer.status_code == 400 and f"{field}:" in answer.text, query
        empty = await client.get("/ui/jobs/actions/new?kind=cancel&selection=1")
        assert empty.status_code == 400 and "ids:" in empty.text
    async with served.client() as api:
        many = {"filter": {"ids": list(range(1, 1002))}}
        for body in (many, {"filter": {"ids": []}}, {"filter": {"ids": ["1"]}}):
            answer = await api.post("/jobs/actions/cancel", json=body)
            assert answer.status_code == 422, answer.text
            assert answer.json()["field"] == "filter.ids"
        body = {"filter": {"ids": [few[6], few[3]]}}
        started = await api.post("/jobs/actions/cancel", json=body)
        assert started.status_code == 202 and started.json()["matched"] == 2
        assert started.json()["filter"] == {"ids": sorted([few[3], few[6]])}
    await wait_for(lambda: _all_done(conn), timeout=30)


async def test_edit_and_enqueue_from_the_page_as_an_operator_only(
    page: Any, dsn: str, conn: Any, tmp_path: Path
) -> None:
    out = _shots(tmp_path)
    job = (await pgworker.enqueue(conn, "send-invoice", {"invoice_id": 1, "amount": 5})).job
    hostile = "<script>alert(1)</script>"
    marked = (await pgworker.enqueue(conn, hostile, {"note": "<script>alert(2)</script>"})).job
    later = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    async with serving(dsn, "--app", "tests.apps.typed", token=None, env=OPERATORS) as served:
        _log_in(page, served, ALICE)
        page.get(f"{served.url}/ui/jobs/{job.id}")
        css(page, f"a[href='/ui/jobs/{job.id}/edit']").click()
        until(page, lambda d: d.current_url.endswith("/edit"))
        run_at = css(page, "input[name=run_at]")
        run_at.clear()
        run_at.send_keys(later.isoformat())
        box = css(page, "textarea[name=payload]")
        box.clear()
        box.send_keys('{"invoice_id": 1, "amount": "lots"}')
        css(page, "form.edit button[type=submit]").click()
        error = until(page, lambda d: css(d, "#form-error"))
        assert error.get_attribute("data-field") == "payload.amount", error.text
        assert "payload.amount" in error.text
        page.save_screenshot(str(out / "edit-refused.png"))
        assert (
            await conn.fetchval(
                "SELECT payload->>'amount' FROM pgworker.jobs WHERE id = $1", job.id
            )
            == "5"
        )
        box = css(page, "textarea[name=payload]")  # the form comes back with what was typed
        assert '"lots"' in box.get_attribute("value")
        box.clear()
        box.send_keys('{"invoice_id": 1, "amount": 7}')
        css(page, "form.edit button[type=submit]").click()
        until(page, lambda d: d.current_url == f"{served.url}/ui/jobs/{job.id}")
        assert "was changed: run_at, payload" in css(page, ".flash").text
        row = await conn.fetchrow("SELECT run_at, payload FROM pgworker.jobs WHERE id = $1", job.id)
        assert row["run_at"] == later
        assert json.loads(row["payload"]) == {"invoice_id": 1, "amount": 7, "items": []}

        # enqueue a typed job from the form its payload schema draws
        page.get(f"{served.url}/ui/enqueue")
        css(page, "nav.tasks a[href='?type=send-invoice']").click()
        until(page, lambda d: css(d, "input[name='f.amount']"))
        css(page, "input[name='f.invoice_id']").send_keys("9")
        css(page, "input[name='f.amount']").send_keys("12")
        page.save_screenshot(str(out / "enqueue-form.png"))
        css(page, "form.edit button[type=submit]").click()
        until(page, lambda d: re.search(r"/ui/jobs/\d+$", d.current_url))
        new_id = int(page.current_url.rsplit("/", 1)[1])
        assert f"Job {new_id} was enqueued on billing" in css(page, ".flash").text
        made = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", new_id)
        assert (made["type"], made["queue"], made["priority"]) == ("send-invoice", "billing", 20)
        assert json.loads(made["payload"]) == {"invoice_id": 9, "amount": 12, "items": []}
        page.get(f"{served.url}/ui/log")
        log = text_of(page)
        assert "enqueued" in log and "updated" in log and "alice" in log

        async with _client(served, ALICE) as alice, _client(served, READER) as reader:
            form = await alice.get(f"/ui/jobs/{job.id}/edit")
            token = csrf_of(form.text)
            edit = {"priority": "3"}
            for data, headers in [
                (edit, {}),
                ({**edit, "csrf": "forged"}, {}),
                ({**edit, "csrf": token}, {"Origin": "http://evil.example"}),
            ]:
                refused = await alice.post(f"/ui/jobs/{job.id}/edit", data=data, headers=headers)
                assert refused.status_code == 403, (data, headers)
                refused = await alice.post(
                    "/ui/enqueue", data={**data, "type": "echo"}, headers=headers
                )
                assert refused.status_code == 403, data
            bad = await alice.post(
                "/ui/enqueue",
                data={"csrf": token, "type": "send-invoice", "f.invoice_id": "x", "f.amount": "1"},
            )
            assert bad.status_code == 422 and 'data-field="payload.invoice_id"' in bad.text

            # the API's PATCH checks a typed task's payload with the same function
            patch = await alice.patch(
                f"/jobs/{job.id}",
                json={"payload": {"invoice_id": 1, "amount": "x"}},
                headers={"Authorization": f"Bearer {ALICE}"},
            )
            assert patch.status_code == 422 and patch.json()["field"] == "payload.amount"

            for path in (f"/ui/jobs/{job.id}/edit", "/ui/enqueue"):
                assert (await reader.get(path)).status_code == 403, path
            read_token = csrf_of((await reader.get("/ui/jobs")).text)
            for path, data in [
                (f"/ui/jobs/{job.id}/edit", {"csrf": read_token, "priority": "3"}),
                ("/ui/enqueue", {"csrf": read_token, "type": "echo", "payload": "{}"}),
            ]:
                assert (await reader.post(path, data=data)).status_code == 403, path

            # markup in a type and a payload is text on every page that shows it
            for path in (
                "/ui/jobs",
                f"/ui/jobs/{marked.id}/edit",
                f"/ui/enqueue?type={hostile}",
            ):
                html = (await alice.get(path)).text
                assert "<script>alert" not in html, path
                assert "&lt;script&gt;alert(" in html, path
    assert (
        await conn.fetchval("SELECT priority FROM pgworker.jobs WHERE id = $1", job.id)
        == job.priority
    )
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 3
    events = await conn.fetch("SELECT kind, actor FROM pgworker.job_events ORDER BY id")
    assert [(e["kind"], e["actor"]) for e in events] == [
        ("updated", "alice"),
        ("enqueued", "alice"),
    ]
