"""Named operators: `pgworker.web.Operator`, tokens from a file or
$PGWORKER_TOKENS, a trusted proxy's header only when enabled, the `read` role refused every
change (403) on the API and the dashboard whatever the route, actions recorded under the
operator's name, and the operator log's page."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import pgworker
from pgworker.errors import ConfigError
from pgworker.web import Operator

from .helpers import has_status
from .test_dashboard import csrf_of, http
from .webserver import ROOT, Served, serving

pytestmark = pytest.mark.asyncio(loop_scope="session")

ALICE = "alice-token-0123456789"
READER = "reader-token-0123456789"
TOKENS = f"""# who may use the dashboard
alice:{ALICE}:operate

reader:{READER}:read
"""


async def operator_log(conn: Any) -> list[tuple[str, str, str]]:
    rows = await conn.fetch("SELECT actor, action, queue FROM pgworker.operator_log ORDER BY id")
    return [tuple(r) for r in rows]


# --- the Operator value and the tokens file ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "token", "role", "field"),
    [
        ("", ALICE, "read", "name"),
        ("a:b", ALICE, "read", "name"),
        ("alice", "short", "read", "token"),
        ("alice", "with space 0123456789", "read", "token"),
        ("alice", "with,comma,0123456789", "read", "token"),
        ("alice", ALICE, "admin", "role"),
    ],
)
async def test_a_bad_operator_is_a_config_error_naming_the_field(name, token, role, field):
    with pytest.raises(ConfigError) as caught:
        Operator(name, token, role)
    assert caught.value.field == field
    assert token not in str(caught.value) or token == ""


async def test_an_operator_never_shows_its_token():
    alice = Operator("alice", ALICE, "operate")
    assert ALICE not in repr(alice) and ALICE not in str(alice)
    with pytest.raises(AttributeError):
        alice.role = "read"  # type: ignore[misc]


async def test_a_tokens_file_skips_blank_lines_and_comments():
    from pgworker._web.operators import parse

    found = parse(TOKENS, "--tokens-file")
    assert [(o.name, o.role) for o in found] == [("alice", "operate"), ("reader", "read")]
    # a token may hold a colon: the name ends at the first, the role follows the last
    (odd,) = parse("bob:to:ken:0123456789abcdef:read", "x")
    assert odd.token == "to:ken:0123456789abcdef"
    documented = parse((ROOT / "examples/tokens.txt").read_text(), "--tokens-file")
    assert [(o.name, o.role) for o in documented] == [("alice", "operate"), ("dashboards", "read")]
    env = parse(f"alice:{ALICE}:operate, reader:{READER}:read", "PGWORKER_TOKENS", separators=",")
    assert [o.name for o in env] == ["alice", "reader"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (f"alice:{ALICE}:operate\nbob {READER} read\n", "--tokens-file line 2"),
        (f"# c\n\nalice:{ALICE}:admin\n", "--tokens-file line 3"),
        (f"alice:{ALICE}:operate\nalice:{READER}:read\n", "--tokens-file"),
        (f"alice:{ALICE}:operate\nbob:{ALICE}:read\n", "--tokens-file"),
    ],
)
async def test_a_bad_line_is_refused_naming_its_number_never_its_token(text, where):
    from pgworker._web.operators import parse

    with pytest.raises(ConfigError) as caught:
        parse(text, "--tokens-file")
    assert caught.value.field == where
    assert ALICE not in str(caught.value) and READER not in str(caught.value)


async def test_serve_refuses_a_bad_tokens_file_at_start(dsn, tmp_path):
    bad = tmp_path / "tokens"
    bad.write_text(f"alice:{ALICE}:operate\nreader:{READER}:superuser\n")
    done = subprocess.run(
        [sys.executable, "-m", "pgworker", "serve", "--dsn", dsn, "--tokens-file", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2, done.stderr
    assert "--tokens-file line 2" in done.stderr and "role" in done.stderr
    assert READER not in done.stderr and ALICE not in done.stderr


# --- the API ------------------------------------------------------------------------------------


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_read_operator_looks_and_an_operate_one_acts_under_its_name(dsn, conn, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    failed = await pgworker.enqueue(conn, "t", {})
    await conn.execute(
        "UPDATE pgworker.jobs SET status = 'failed', finished_at = now() WHERE id = $1",
        failed.job.id,
    )
    async with (
        serving(dsn, "--tokens-file", str(tokens), token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        reader, alice = _bearer(READER), _bearer(ALICE)
        assert (await client.get("/queues", headers=reader)).status_code == 200
        for path in ("/queues/mail/pause", f"/jobs/{failed.job.id}/replay", "/jobs"):
            refused = await client.post(path, headers=reader, json={"type": "t"})
            assert refused.status_code == 403, (path, refused.text)
            assert "read role" in refused.json()["error"]
        patched = await client.patch(f"/jobs/{failed.job.id}", headers=reader, json={"priority": 3})
        assert patched.status_code == 403
        assert await operator_log(conn) == []
        assert (await client.post("/queues/mail/pause", headers=alice)).status_code == 200
        # a named operator cannot act under another name
        other = await client.post("/queues/mail/resume", headers=alice, json={"by": "bob"})
        assert other.status_code == 422 and other.json()["field"] == "by"
        replayed = await client.post(f"/jobs/{failed.job.id}/replay", headers=alice)
        assert replayed.status_code == 200, replayed.text
        unknown = await client.get("/queues", headers=_bearer("nobody-0123456789abc"))
        assert unknown.status_code == 401
    assert await operator_log(conn) == [("alice", "pause", "mail")]
    event = await conn.fetchrow(
        "SELECT kind, actor FROM pgworker.job_events WHERE job_id = $1", failed.job.id
    )
    assert tuple(event) == ("replayed", "alice")


async def test_the_trusted_header_is_read_only_when_enabled(dsn, conn):
    user = {"X-Forwarded-User": "carol@example.com"}
    async with (
        serving(dsn) as plain,
        httpx.AsyncClient(base_url=plain.url) as client,
    ):  # the option off: the header is anyone's
        assert (await client.get("/queues", headers=user)).status_code == 401
        assert (await client.post("/queues/mail/pause", headers=user)).status_code == 401
        page = await client.get("/", headers=user)
        assert page.status_code == 303 and "/ui/login" in page.headers["location"]
    args = ("--trusted-user-header", "X-Forwarded-User")
    async with (
        serving(dsn, *args, token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.get("/queues")).status_code == 401  # no header: nobody
        assert (await client.get("/queues", headers=user)).status_code == 200
        assert (await client.post("/queues/mail/pause", headers=user)).status_code == 403
        page = await client.get("/", headers=user)
        assert page.status_code == 200 and "carol@example.com" in page.text
        assert 'action="/ui/queues/pause"' not in page.text  # no button for a reader
    async with (
        serving(dsn, *args, "--trusted-user-role", "operate", token=None) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.post("/queues/mail/pause", headers=user)).status_code == 200
    assert await operator_log(conn) == [("carol@example.com", "pause", "mail")]


# --- the dashboard ------------------------------------------------------------------------------


async def _log_in(client: httpx.AsyncClient, token: str, root: str = "") -> None:
    form = await client.get(f"{root}/ui/login")
    answer = await client.post(
        f"{root}/ui/login", data={"csrf": csrf_of(form.text), "token": token, "next": f"{root}/"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == f"{root}/", answer.text


@contextlib.asynccontextmanager
async def _dashboard(served: Served, token: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
        await _log_in(client, token)
        yield client


async def test_the_dashboard_refuses_a_reader_every_button(dsn, conn, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    job = await pgworker.enqueue(conn, "t", {}, queue="mail")
    async with (
        serving(dsn, "--tokens-file", str(tokens), token=None) as served,
        _dashboard(served, READER) as client,
    ):
        page = (await client.get("/")).text
        assert "reader" in page and 'action="/ui/queues/pause"' not in page
        assert 'action="/ui/jobs/' not in (await client.get(f"/ui/jobs/{job.job.id}")).text
        csrf = csrf_of(page)
        for path in (
            "/ui/queues/pause",
            "/ui/queues/limit",
            f"/ui/jobs/{job.job.id}/cancel",
            "/ui/anything/added/later",
        ):
            answer = await client.post(path, data={"csrf": csrf, "queue": "mail"})
            assert answer.status_code in (403, 404), path
            if path != "/ui/anything/added/later":
                assert answer.status_code == 403 and "read role" in answer.text, path
        # logging out stays open to a reader
        out = await client.post("/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303
        assert await operator_log(conn) == []
        assert await conn.fetchval(
            "SELECT status FROM pgworker.jobs WHERE id = $1", job.job.id
        ) == ("pending")
        async with _dashboard(served, ALICE) as client:
            page = (await client.get("/")).text
            assert 'action="/ui/queues/pause"' in page
            pressed = await client.post(
                "/ui/queues/pause", data={"csrf": csrf_of(page), "queue": "mail"}
            )
            assert pressed.status_code == 303
            log = (await client.get("/ui/log")).text
            assert "alice" in log and "pause" in log and "queue mail" in log
    assert await operator_log(conn) == [("alice", "pause", "mail")]


async def test_the_operator_log_pages_newest_first(dsn, conn):
    for i in range(105):
        await pgworker.pause_queue(conn, f"q{i}", by=f"op{i}")
    async with serving(dsn) as served, _dashboard(served, served.token) as client:
        first = (await client.get("/ui/log")).text
        assert "op104" in first and "op5<" in first and "op4<" not in first
        older = first.split('href="/ui/log?before=')[1].split('"')[0]
        second = (await client.get(f"/ui/log?before={older}".replace("&amp;", "&"))).text
        assert "op4<" in second and "op0<" in second and "op5<" not in second
        bad = await client.get("/ui/log?before=yesterday")
        assert bad.status_code == 400


# --- pages of other sites, a header sent twice, a Windows tokens file, the log's cursor ------


USER = "X-Forwarded-User"


EVIL = "https://evil.example"


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
