"""Every number a person types (a URL, a form, an argument, a variable) is read one way: ASCII
digits (validate.whole and validate.real). `int()` also takes fullwidth and Arabic-Indic digits,
`1_0` and spaces around; `str.isdigit()` says yes to superscripts, which `int()` then refuses."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import pgworker
from pgworker import _validate as validate
from pgworker.settings import Settings

from .helpers import ROOT, cli
from .webserver import Served, server

session = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name

NOT_WHOLE = [
    "²",
    "⁹",
    "\uff11",
    "\u0661\u0662",
    "\u0663",
    "1_0",
    "+5",
    " 5",
    "5 ",
    "1.0",
    "",
    "-",
    "0x10",
    "1e3",
]


def test_whole_and_real_read_ascii_digits_only() -> None:
    wholes = [validate.whole(t) for t in ("0", "7", "-12", "0042", str(2**63))]
    assert wholes == [0, 7, -12, 42, 2**63]
    reals = [validate.real(t) for t in ("1", "-0.5", "2.5e3", ".5", "3.")]
    assert reals == [1.0, -0.5, 2500.0, 0.5, 3.0]
    for text in [*NOT_WHOLE, "9" * 41, None, 5]:
        with pytest.raises(ValueError):
            validate.whole(text)
    for text in [
        "²",
        "\uff11",
        "\u0661.\u0665",
        "1_0.5",
        "nan",
        "inf",
        "-inf",
        "+1",
        " 1",
        "1e",
        ".",
        None,
    ]:
        with pytest.raises(ValueError):
            validate.real(text)


@session
async def test_api_url_numbers_are_ascii_digits(server: Served, conn: Any) -> None:
    job = await pgworker.enqueue(conn, "t", {})
    async with server.client() as c:
        assert (await c.get(f"/jobs/{job.job.id}")).status_code == 200
        page = await c.get(f"/jobs?limit=5&before={job.job.id + 1}")
        assert page.status_code == 200 and page.json()["jobs"][0]["id"] == job.job.id
        for text in ["\uff11", "\u0661", "²", "1.0", "%201", "%2B1", "1_0", f"{job.job.id}%20"]:
            answer = await c.get(f"/jobs/{text}")
            assert answer.status_code == 422, (text, answer.text)
            assert answer.json()["field"] == "id"
            answer = await c.post(f"/jobs/{text}/cancel")
            assert answer.status_code == 422 and answer.json()["field"] == "id", text
        for field in ("limit", "before"):
            for text in ["²", "\uff11", "\u0663", "1_0", "%2B5", "%205", "1.0"]:
                answer = await c.get(f"/jobs?{field}={text}")
                assert answer.status_code == 422, (field, text, answer.text)
                assert answer.json()["field"] == field
    assert await pgworker.get_job(conn, job.job.id) is not None
    assert (await pgworker.get_job(conn, job.job.id)).status == "pending"  # type: ignore[union-attr]
    assert "Traceback" not in server.stderr()


@session
async def test_cli_arguments_are_ascii_digits(dsn: str, conn: Any) -> None:
    for option, text in [
        ("--max-retries", "\u0663"),
        ("--max-retries", "\uff11"),
        ("--priority", "\u0661"),
        ("--delay", "\u0661"),
        ("--delay", "nan"),
    ]:
        done = cli("enqueue", "t", "--payload", "{}", option, text, "--dsn", dsn)
        assert done.returncode == 2, (option, text, done.stdout, done.stderr)
        assert option in done.stderr and "Traceback" not in done.stderr
    assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 0
    done = cli("enqueue", "t", "--priority", "-5", "--max-retries", "2", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    row = await conn.fetchrow("SELECT priority, max_retries FROM pgworker.jobs")
    assert (row["priority"], row["max_retries"]) == (-5, 2)


def test_variables_are_ascii_digits() -> None:
    dsn = "postgresql://u@h/d"
    good = Settings.from_env(
        {"PGWORKER_CONCURRENCY": " 12 ", "PGWORKER_LEASE": "7.5", "PGWORKER_RETAIN_FAILED": "3d"},
        dsn=dsn,
    )
    assert (good.concurrency, good.lease, good.retain_failed) == (12, 7.5, 3 * 86400.0)
    for name, raw in [
        ("PGWORKER_CONCURRENCY", "\u0661\u0660"),
        ("PGWORKER_CONCURRENCY", "1_0"),
        ("PGWORKER_LEASE", "\uff11"),
        ("PGWORKER_POLL_INTERVAL", "\u0663.\u0665"),
        ("PGWORKER_RETAIN_COMPLETED", "\u0663d"),
        ("PGWORKER_RETAIN_FAILED", "²h"),
    ]:
        with pytest.raises(pgworker.ConfigError, match="(?i)" + name):
            Settings.from_env({name: raw}, dsn=dsn)


def test_the_payload_byte_limit_variable_is_ascii_digits() -> None:
    code = "import pgworker._validate as l; print(l.MAX_PAYLOAD_BYTES)"
    for raw, ok in [
        ("2048", True),
        (" 2048\n", True),
        ("\uff12\uff10\uff14\uff18", False),
        ("2_048", False),
    ]:
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={"PGWORKER_MAX_PAYLOAD_BYTES": raw, "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
        assert (done.returncode == 0) == ok, (raw, done.stderr)
        if ok:
            assert done.stdout.strip() == "2048"


def test_a_cancel_notification_is_a_job_id_in_ascii_digits_or_nothing() -> None:
    """Anyone may NOTIFY the cancel channel: `²` raised in the listener's callback (isdigit then
    int), and an Arabic-Indic one stopped job 1."""
    from pgworker._runtime.notifier import Notifier

    asked: list[int] = []
    notifier = Notifier("postgresql://u@h/d", "pgworker", ("default",), None, asked.append, "w")  # type: ignore[arg-type]
    for payload in ["²", "\u0661", "\uff11", "1_0", " 7", "", None]:
        notifier._on_cancel_request(None, 0, "pgworker_cancel", payload)
    notifier._on_cancel_request(None, 0, "pgworker_cancel", "42")
    assert asked == [42]
