"""Why an operator did something, and one entry per thing done: a reason on every bulk action
and pause (page, HTTP API, CLI) kept with the action and in the operator log; a bulk action as
one log entry linked to its progress, listed on the bulk actions page and GET /jobs/actions;
limit entries with the values set; `pgworker status` naming paused and limited queues; the login
page naming every way in. Against a real database and a real `pgworker serve`."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from pgworker import _bulk as bulk
from pgworker._web import log_words
from pgworker.operations import MAX_REASON_LENGTH
from pgworker.web import create_app

from .helpers import cli, wait_for
from .test_bulk import seed_failed
from .test_dashboard import csrf_of, http
from .webserver import serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOO_LONG = "x" * (MAX_REASON_LENGTH + 1)
FIELD = re.compile(r'name="([a-z_]+)" value="([^"]*)"')


async def _log_rows(conn: Any) -> list[tuple[str, str | None]]:
    rows = await conn.fetch("SELECT action, reason FROM pgworker.operator_log ORDER BY id")
    return [(r["action"], r["reason"]) for r in rows]


async def test_reasons_and_one_log_entry_per_bulk_action_through_page_and_api(dsn, conn):
    ids = await seed_failed(conn, 12)
    async with serving(dsn) as served:
        # The login page names every way in (no proxy header here: not said).
        async with httpx.AsyncClient(base_url=served.url) as anonymous:
            login = (await anonymous.get("/ui/login")).text
        for way in ("--token", "PGWORKER_API_TOKEN", "--tokens-file", "PGWORKER_TOKENS"):
            assert way in login, way
        assert "proxy" not in login

        async with http(served) as page, served.client() as api:
            # A bulk replay of 12 jobs from the page, with a reason.
            confirm = await page.get(
                "/ui/jobs/actions/new", params={"kind": "replay", "status": "failed"}
            )
            assert 'name="reason"' in confirm.text
            fields = dict(FIELD.findall(confirm.text))
            started = await page.post(
                "/ui/jobs/actions", data={**fields, "reason": "mail service <back>"}
            )
            assert started.status_code == 303, started.text
            progress = started.headers["location"]
            action_id = int(progress.rsplit("/", 1)[1])

            async def done() -> bool:
                found = await bulk.get(conn, action_id)
                return found is not None and found.state == "done"

            await wait_for(done, timeout=30, every=0.05)
            shown = (await page.get(progress)).text
            assert "mail service &lt;back&gt;" in shown

            # Pause from the page, with a reason; a reason too long is refused, naming it.
            queues = await page.get("/")
            for reason, status in ((TOO_LONG, 400), ("deploy in progress", 303)):
                pressed = await page.post(
                    "/ui/queues/pause",
                    data={"csrf": csrf_of(queues.text), "queue": "other", "reason": reason},
                )
                assert pressed.status_code == status, pressed.text[:300]
            assert "deploy in progress" in (await page.get("/")).text

            # The API: pause, bulk and limit bodies take a reason, bounded (422 naming it).
            for path, body in (
                ("/queues/mail/pause", {}),
                ("/jobs/actions/cancel", {"filter": {"queue": "nowhere"}}),
            ):
                refused = await api.post(path, json={**body, "reason": TOO_LONG})
                assert refused.status_code == 422 and refused.json()["field"] == "reason", (
                    path,
                    refused.text,
                )
            paused = await api.post("/queues/mail/pause", json={"reason": "SMTP down"})
            assert paused.status_code == 200, paused.text
            cancel = await api.post(
                "/jobs/actions/cancel", json={"filter": {"queue": "nowhere"}, "reason": "cleanup"}
            )
            assert cancel.status_code == 202 and cancel.json()["reason"] == "cleanup"

            async def cancelled() -> bool:
                found = await bulk.get(conn, cancel.json()["id"])
                return found is not None and found.state == "done"

            await wait_for(cancelled, timeout=30, every=0.05)
            limited = await api.post(
                "/queues/mail/limit", json={"max_running": 5, "rate": "10/s", "reason": "quota"}
            )
            assert limited.status_code == 200, limited.text

            # The operator log: one entry for the 12 replays, linked to its progress page.
            log = (await page.get("/ui/log")).text
            assert log.count("bulk replay of 12 jobs") == 1, log
            assert f'href="/ui/jobs/actions/{action_id}"' in log
            assert "mail service &lt;back&gt;" in log
            assert not any(f'href="/ui/jobs/{i}"' in log for i in ids)
            assert "limit: max_running 5, rate 10/s (was no limit)" in log
            assert "bulk cancel of 0 jobs" in log

            # The bulk actions page and its JSON list, newest first, each with its reason.
            listing = (await page.get("/ui/jobs/actions")).text
            assert f'href="/ui/jobs/actions/{action_id}"' in listing
            assert "mail service &lt;back&gt;" in listing and "cleanup" in listing
            assert '/ui/jobs/actions"' in (await page.get("/ui/log")).text  # the nav links it
            first = (await api.get("/jobs/actions", params={"limit": 1})).json()
            assert [a["kind"] for a in first["actions"]] == ["cancel"]
            rest = (
                await api.get("/jobs/actions", params={"limit": 1, "before": first["next_before"]})
            ).json()
            assert [(a["id"], a["reason"]) for a in rest["actions"]] == [
                (action_id, "mail service <back>")
            ]
            assert rest["next_before"] is None
            done_only = (await api.get("/jobs/actions", params={"status": "done"})).json()
            assert len(done_only["actions"]) == 2
            bad = await api.get("/jobs/actions", params={"status": "stuck"})
            assert bad.status_code == 422 and bad.json()["field"] == "status"

    # Stored: the reasons with the actions and in the operator log, once per action.
    assert await _log_rows(conn) == [
        ("bulk_replay", "mail service <back>"),
        ("pause", "deploy in progress"),
        ("pause", "SMTP down"),
        ("bulk_cancel", "cleanup"),
        ("limit", "quota"),
    ]
    # Each job's history still says who replayed it and why, naming the action.
    events = await conn.fetch(
        "SELECT reason, detail FROM pgworker.job_events WHERE kind = 'replayed' ORDER BY job_id"
    )
    assert len(events) == 12
    assert all(
        e["reason"] == "mail service <back>" and json.loads(e["detail"])["bulk_action"] == action_id
        for e in events
    )


async def test_cli_reasons_reach_the_log_and_status_names_paused_and_limited_queues(dsn, conn):
    await conn.execute(
        "INSERT INTO pgworker.jobs (type, queue, payload) VALUES ('t', 'mail', '{}')"
    )
    refused = cli(
        "cancel", "--filter", "--queue", "mail", "--yes", "--reason", TOO_LONG, "--dsn", dsn
    )
    assert refused.returncode != 0 and "--reason" in refused.stderr, refused.stderr
    assert (
        cli(
            "cancel",
            "--filter",
            "--queue",
            "mail",
            "--yes",
            "--reason",
            "wrong queue",
            "--by",
            "carol",
            "--dsn",
            dsn,
        ).returncode
        == 0
    )
    assert (
        cli(
            "queue", "pause", "mail", "--reason", "SMTP down", "--by", "carol", "--dsn", dsn
        ).returncode
        == 0
    )
    assert cli("queue", "limit", "bulk", "5", "--rate", "10/s", "--dsn", dsn).returncode == 0
    assert cli("queue", "resume", "mail", "--reason", "SMTP back", "--dsn", dsn).returncode == 0
    assert (
        cli("queue", "pause", "mail", "--reason", "again", "--by", "carol", "--dsn", dsn).returncode
        == 0
    )
    assert await _log_rows(conn) == [
        ("bulk_cancel", "wrong queue"),
        ("pause", "SMTP down"),
        ("limit", None),
        ("resume", "SMTP back"),
        ("pause", "again"),
    ]
    assert await conn.fetchval("SELECT reason FROM pgworker.bulk_actions") == "wrong queue"

    status = cli("status", "--dsn", dsn)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].split()[0] == "queue"  # the table stays first, as it was
    paused = lines.index("paused queues: 1")
    assert re.fullmatch(r"  mail: paused since \S+Z by carol: again", lines[paused + 1])
    limited = lines.index("limited queues: 1")
    assert lines[limited + 1] == "  bulk: max_running 5, rate 10/s"
    found = json.loads(cli("status", "--json", "--dsn", dsn).stdout)
    assert {c["queue"]: c["limits"] for c in found["controls"]} == {
        "bulk": {"max_running": 5, "rate": "10/s"},
        "mail": {},
    }


async def test_the_login_page_names_the_proxy_header_when_trusted(pool):
    app = create_app(pool, trusted_user_header="X-Forwarded-User", read_only=True)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        login = (await client.get("/ui/login")).text
    assert "x-forwarded-user" in login.lower() and "--tokens-file" in login


async def test_log_entries_in_words() -> None:
    limit = {
        "source": "queue",
        "action": "limit",
        "detail": json.dumps(
            {
                "old": {"max_running": 2, "rate_limit": None, "rate_period": None},
                "new": {"max_running": None, "rate_limit": 600, "rate_period": 60},
            }
        ),
    }
    assert log_words.entry(limit)["what"] == "limit: rate 600/m (was max_running 2)"
    action = {
        "source": "queue",
        "action": "bulk_delete",
        "detail": json.dumps({"action_id": 7, "matched": 1, "filter": {"queue": "mail"}}),
    }
    found = log_words.entry(action)
    assert (found["what"], found["action_id"], found["filter"]) == (
        "bulk delete of 1 job",
        7,
        "queue mail",
    )
    odd = {"source": "queue", "action": "bulk_replay", "detail": "[1]"}
    assert log_words.entry(odd)["what"] == "bulk_replay"
