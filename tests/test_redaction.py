"""Secrets kept out: error texts are redacted before they are stored
(`jobs.error`, `job_attempts.error_message`, `job_attempts.error_detail`) or logged, and a DSN's
password never appears in a pgworker message."""

from __future__ import annotations

import json
import signal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import pgworker
from pgworker import Settings
from pgworker._db import connection
from pgworker._redact import (
    DEFAULT_KEYS,
    DETAIL_LIMIT,
    MESSAGE_LIMIT,
    REDACTED,
    detail,
    redact_dsn,
    redact_payload,
    redactor,
    scrub,
    summary,
)

from .helpers import all_finished, cli, has_status, serving_guarded, spawn_worker, wait_for

aio = pytest.mark.asyncio(loop_scope="session")

SECRETS = ("hunter2-xyz", "sk_live_123", "pw-789")
PAYLOAD = {"password": "hunter2-xyz", "api_key": "sk_live_123"}
DSN_PASSWORD = "dsn-pass-4567"


def with_password(dsn: str, password: str) -> str:
    """`dsn` with a password (the test server trusts every login: it is not checked)."""
    parts = urlsplit(dsn)
    where = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    netloc = f"{parts.username or 'postgres'}:{password}@{where}"
    return urlunsplit(parts._replace(netloc=netloc))


# --- the rules ---------------------------------------------------------------------------------


def test_payload_values_are_redacted_wherever_they_appear_at_any_depth():
    r = redactor()
    payload = {
        "user": "bob-the-user",
        "Api_Key": "k-123456",
        "deep": [{"x": {"DB_PASSWORD": "p4ssw0rd"}}, {"access_token": 98765432}],
        "credentials": {"user": "carol-x", "pin": ["1234-5678"]},
        "pin": "12",
        "token": "abc",
    }
    text = "bob-the-user k-123456 p4ssw0rd 98765432 carol-x 1234-5678 abc 12"
    assert r.text(text, payload) == (
        f"bob-the-user {REDACTED} {REDACTED} {REDACTED} {REDACTED} {REDACTED} abc 12"
    )
    # As repr() and JSON write them too.
    quoted = {"secret": 'he said "hi"\n'}
    assert r.text(repr(quoted) + json.dumps(quoted), quoted).count("hi") == 0


def test_urls_pairs_and_bearer_tokens_are_redacted_without_a_payload():
    r = redactor()
    cases = {
        "via postgresql://u:pw-789@db/x": f"via postgresql://u:{REDACTED}@db/x",
        "redis://:s3cret@h:6379/0 and http://host:8080/a": (
            f"redis://:{REDACTED}@h:6379/0 and http://host:8080/a"
        ),
        "password=abc user=bob": f"password={REDACTED} user=bob",
        "db_passwd: x1, other: y": f"db_passwd: {REDACTED}, other: y",
        '{"client_secret": "a b c", "id": "z"}': f'{{"client_secret": "{REDACTED}", "id": "z"}}',
        "{'Authorization': 'Basic dXNlcjpw'}": f"{{'Authorization': '{REDACTED}'}}",
        "Authorization: Bearer eyJ.abc-def": f"Authorization: {REDACTED}",
        "sent bearer eyJ.abc-def=": f"sent bearer {REDACTED}",
        "?access_token=tok&page=2": f"?access_token={REDACTED}&page=2",
        "the password is wrong": "the password is wrong",
    }
    for text, expected in cases.items():
        assert r.text(text) == expected, text
    assert scrub("postgresql://u:pw-789@db/x") == f"postgresql://u:{REDACTED}@db/x"


def test_the_key_list_is_configurable():
    custom = redactor(("ssn",))
    assert custom.text("ssn=123-45-6789 password=x", {"my_ssn": "123-45-6789"}) == (
        f"ssn={REDACTED} password=x"
    )
    nothing = redactor(())
    assert nothing.text("password=x 12345678", {"password": "12345678"}) == ("password=x 12345678")
    env = {"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_REDACT_KEYS": " SSN, pin ,,"}
    assert Settings.from_env(env).redact_keys == ("ssn", "pin")
    assert Settings(dsn="x").redact_keys == DEFAULT_KEYS


@pytest.mark.parametrize("keys", ["password", [""], ["a\x00"], None, [1]])
def test_bad_redact_keys_name_the_field(keys):
    with pytest.raises(pgworker.ConfigError) as raised:
        Settings(dsn="x", redact_keys=keys)
    assert raised.value.field == "redact_keys"


def test_redact_payload_returns_a_redacted_copy():
    payload = {"a": 1, "Password": "x", "list": [{"apikey": {"k": "v"}}], "n": None}
    shown = redact_payload(payload, DEFAULT_KEYS)
    assert shown == {"a": 1, "Password": REDACTED, "list": [{"apikey": REDACTED}], "n": None}
    assert payload["Password"] == "x" and payload["list"][0]["apikey"] == {"k": "v"}
    assert redact_payload({"ssn": "1"}, ["SSN"]) == {"ssn": REDACTED}
    assert redact_payload([1, "x"], DEFAULT_KEYS) == [1, "x"]


def test_messages_are_one_line_and_tracebacks_8_kb():
    assert summary("\n  first line  \nsecond") == "first line"
    assert len(summary("x" * 5000)) == MESSAGE_LIMIT
    long = "é" * 10_000 + "THE END"
    cut = detail(long)
    assert len(cut.encode()) <= DETAIL_LIMIT and cut.endswith("THE END") and cut.startswith("é")
    # Redacted before cut: a secret across the limit is not left half shown.
    r = redactor()
    text = "x" * (MESSAGE_LIMIT - 3) + " password=hunter2-xyz"
    assert "hun" not in summary(r.text(text))


def test_hostile_texts_are_redacted_in_linear_time():
    """About 10 ms of CPU each; a pattern that backtracks takes minutes on them. The time is
    this thread's CPU time, which a loaded machine does not stretch as it stretches the wall
    clock."""
    import time

    r = redactor()
    for text in ("a" * 60_000, "token" * 12_000, "a.a." * 15_000 + "://", "x:" * 30_000):
        started = time.thread_time()
        r.text(text, PAYLOAD)
        assert time.thread_time() - started < 2.0, text[:20]


# --- a DSN's password --------------------------------------------------------------------------


def test_settings_never_show_the_dsn_password():
    s = Settings(dsn=f"postgresql://app:{DSN_PASSWORD}@db/app")
    assert DSN_PASSWORD not in repr(s) and f"app:{REDACTED}@db" in repr(s)
    s = Settings(dsn=f"host=db user=app password={DSN_PASSWORD}")
    assert DSN_PASSWORD not in repr(s)
    dsn = "postgresql://app:p%40ss-word@db/app"
    assert "p@ss-word" not in redact_dsn("login for p@ss-word failed", dsn)


@aio
@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{DSN_PASSWORD}@127.0.0.1:1/app",
        f"postgresql://app:{DSN_PASSWORD}@127.0.0.1:notaport/app",
        f"postgresql://app:{DSN_PASSWORD}@127.0.0.1:1/app?sslmode=bogus",
    ],
)
async def test_database_unavailable_never_shows_the_dsn_password(dsn):
    registry = pgworker.Registry()
    registry.task("t")(lambda ctx, payload: None)
    with pytest.raises(pgworker.DatabaseUnavailable) as raised:
        async with pgworker.Worker(registry, dsn):
            pass
    assert DSN_PASSWORD not in str(raised.value), raised.value
    out = cli("status", "--dsn", dsn)
    assert out.returncode == 2 and out.stderr.strip(), out
    assert DSN_PASSWORD not in out.stdout + out.stderr, out.stderr


@pytest.mark.parametrize("form", ["url", "keywords"])
def test_a_driver_quoting_the_dsn_back_shows_no_password(form):
    dsn = (
        f"postgresql://app:{DSN_PASSWORD}@db/app"
        if form == "url"
        else f"host=db user=app password={DSN_PASSWORD}"
    )
    for exc in (ValueError(f"invalid DSN {dsn!r}"), OSError(f"cannot use {DSN_PASSWORD}")):
        message = str(connection._describe(dsn, exc))
        assert DSN_PASSWORD not in message and REDACTED in message, message


# --- the acceptance test: a real worker --------------------------------------------------------


async def stored_texts(conn) -> str:
    """Everything stored about the jobs but their payloads, as one text."""
    jobs = await conn.fetch("SELECT (to_jsonb(j) - 'payload')::text AS t FROM pgworker.jobs j")
    tries = await conn.fetch("SELECT to_jsonb(a)::text AS t FROM pgworker.job_attempts a")
    return "\n".join(r["t"] for r in [*jobs, *tries])


@aio
async def test_no_secret_reaches_the_tables_or_the_worker_log(dsn, conn, tmp_path):
    login = (await pgworker.enqueue(conn, "login", PAYLOAD)).job.id
    leaky_payload = {**PAYLOAD, "nested": {"client_secret": "vault-7788"}}
    leaky = (await pgworker.enqueue(conn, "leaky", leaky_payload)).job.id
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        "tests.apps.secrets",
        with_password(dsn, DSN_PASSWORD),
        log,
        "--log-format",
        "json",
        "--log-level",
        "debug",
    )
    try:
        await wait_for(lambda: all_finished(conn), timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(timeout=30) == 0, log.read_text()
        finally:
            worker.kill()
    text = log.read_text()
    stored = await stored_texts(conn)
    for secret in (*SECRETS, "vault-7788", DSN_PASSWORD):
        assert secret not in stored, (secret, stored)
        assert secret not in text, (secret, text)
    # What is stored and logged is the redacted error, not nothing.
    error = "ValueError: login failed password=[REDACTED] via postgresql://u:[REDACTED]@db/x"
    assert await conn.fetchval("SELECT error FROM pgworker.jobs WHERE id = $1", login) == error
    rows = await conn.fetch(
        "SELECT outcome, error_type, error_message, error_detail FROM pgworker.job_attempts "
        "WHERE job_id = $1 ORDER BY attempt",
        login,
    )
    assert [r["outcome"] for r in rows] == ["retried", "failed"]
    for r in rows:
        assert f"{r['error_type']}: {r['error_message']}" == error
        assert r["error_detail"].startswith("Traceback") and "[REDACTED]" in r["error_detail"]
    leaky_rows = await conn.fetch(
        "SELECT error_message, error_detail FROM pgworker.job_attempts WHERE job_id = $1", leaky
    )
    for r in leaky_rows:
        assert "\n" not in r["error_message"] and r["error_message"].startswith("call failed")
        assert "KeyError" in r["error_detail"] and "second line" in r["error_detail"]
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    failed = [x for x in lines if x.get("event") == "job failed" and x.get("job_id") == login]
    assert [x["error"] for x in failed] == [error], text
    assert any(x.get("event") == "handler raised" for x in lines), text


def test_a_secret_url_encoded_by_quotes_defaults_is_redacted():
    """`urllib.parse.quote` keeps `/` by default: a secret holding one, quoted as an HTTP client
    quotes a path, is found as well."""
    from urllib.parse import quote, quote_plus, urlencode

    payload = {"password": 'p@ss wörd/"x'}
    secret = payload["password"]
    for text in (quote(secret), quote(secret, safe=""), quote_plus(secret), urlencode(payload)):
        assert REDACTED in redactor().text(f"url={text}", payload), text
        assert "ss" not in redactor().text(f"url={text}", payload).replace("password", ""), text


def test_retention_settings_take_what_the_command_line_takes():
    from pgworker import ConfigError, Settings

    dsn = "postgresql://x@h/d"
    assert Settings(dsn, retain_completed="7d").retain_completed == 7 * 86400
    assert Settings(dsn, retain_failed="none").retain_failed is None
    assert Settings(dsn, retain_failed="0").retain_failed is None
    assert Settings(dsn, retain_completed=3600).retain_completed == 3600
    with pytest.raises(ConfigError) as caught:
        Settings(dsn, retain_completed="soon")
    assert caught.value.field == "retain_completed"


def test_secrets_are_found_in_any_letter_case():
    """The README: key names match case-insensitively, payload values are found in any letter
    case, and so are the `key=value` pairs and `Bearer` tokens (each of the four would let a
    secret through if matched in one case only)."""
    r = redactor()
    payload = {"PassWord": "hunter2-xyz", "API_KEY": "sk_live_123"}
    assert redact_payload(payload) == {"PassWord": REDACTED, "API_KEY": REDACTED}
    text = "login failed for HUNTER2-XYZ with key Sk_Live_123"  # a service upper-cases them
    assert r.text(text, payload) == f"login failed for {REDACTED} with key {REDACTED}"
    assert r.text("retry with DB_PassWord=abc1 then") == f"retry with DB_PassWord={REDACTED} then"
    assert r.text("sent BEARER eyJ.abc-def now") == f"sent BEARER {REDACTED} now"
    assert r.text("sent Bearer eyJ.abc-def now") == f"sent Bearer {REDACTED} now"


# --- secrets in another letter case, many secrets, bad redact keys ---------------------------


async def texts_of(conn: Any, job_id: int) -> str:
    """Every text pgworker stored about a job: its row and its attempts' rows."""
    row = await conn.fetchval(
        "SELECT to_jsonb(j)::text FROM pgworker.jobs AS j WHERE id = $1", job_id
    )
    attempts = await conn.fetchval(
        "SELECT coalesce(jsonb_agg(to_jsonb(a)), '[]')::text FROM pgworker.job_attempts AS a "
        "WHERE job_id = $1",
        job_id,
    )
    # The payload holds the secrets as given: what matters is every other column.
    job = json.loads(row)
    del job["payload"]
    return json.dumps(job) + attempts


@pytest.mark.asyncio(loop_scope="session")
async def test_a_secret_in_another_letter_case_or_url_encoded_is_redacted(dsn, conn):
    """The payload's password shown upper-cased, and its api key URL-encoded (as an HTTP
    client's error quotes a query string), were stored word for word in jobs.error and
    job_attempts."""
    registry = pgworker.Registry()

    @registry.task("login", max_retries=0)
    async def login(ctx: pgworker.JobContext, p: dict[str, Any]) -> None:
        from urllib.parse import quote

        raise ValueError(
            f"user {p['password'].upper()} refused; GET /x?k={quote(p['api_key'], safe='')}\n"
            f"second line {p['password'].upper()}"
        )

    payload = {"password": "Hunter2-Xyzzy", "api_key": "sk live/123 ü"}
    r = await pgworker.enqueue(conn, "login", payload)
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "failed"))
    stored = await texts_of(conn, r.job.id)
    assert "[REDACTED]" in stored
    for leak in ("HUNTER2-XYZZY", "sk%20live%2F123%20%C3%BC", "Hunter2"):
        assert leak.lower() not in stored.lower(), leak


@pytest.mark.asyncio(loop_scope="session")
async def test_a_payload_with_many_secrets_never_stalls_the_worker(dsn, conn):
    """20,000 tokens under a sensitive key: each failure searched its texts with a regular
    expression of 20,000+ alternatives, tried at every position, for seconds on the event loop
    (no heartbeat, no claim meanwhile) per text. Now the search is bounded and such a payload's
    error texts are withheld whole: no token is stored, the job fails promptly."""
    import random
    import string
    import time

    from pgworker._redact import redactor

    rng = random.Random(13)
    tokens = ["".join(rng.choices(string.ascii_letters, k=12)) for _ in range(20_000)]
    started = time.thread_time()  # CPU time: a loaded machine does not stretch it
    text = redactor().text("x" * 60_000 + tokens[7], {"tokens": tokens})
    assert time.thread_time() - started < 2.0
    assert tokens[7] not in text

    registry = pgworker.Registry()

    @registry.task("many", max_retries=0)
    async def many(ctx: pgworker.JobContext, p: dict[str, Any]) -> None:
        raise ValueError(f"rejected {p['tokens'][7]} and {p['tokens'][19_999]}")

    r = await pgworker.enqueue(conn, "many", {"tokens": tokens})
    async with serving_guarded(registry, dsn):
        await wait_for(lambda: has_status(conn, r.job.id, "failed"), timeout=20)
    stored = await texts_of(conn, r.job.id)
    assert tokens[7] not in stored and tokens[19_999] not in stored
    assert "REDACTED" in stored


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("keys", ["password", [5], [""], None])
async def test_show_job_with_bad_redact_keys_is_a_validation_error(conn, keys):
    """`redact_keys="password"` redacted every key holding one of its letters; `[5]` raised
    AttributeError once a job was found. Checked like Settings.redact_keys, job or not."""
    from pgworker.operations import show_job

    r = await pgworker.enqueue(conn, "t", {"apple": 1, "password": "hunter2-x"})
    with pytest.raises(pgworker.ValidationError) as caught:
        await show_job(conn, r.job.id, redact_keys=keys)
    assert caught.value.field == "redact_keys"
