"""Text from the database never drives the operator's terminal: every command of the real CLI,
and the console log of `pgworker run`, show the control characters of job types, queues,
errors, tracebacks, payloads, results, worker ids, milestones, steps and replays as visible
escapes."""

from __future__ import annotations

import ast
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

import pgworker
from pgworker import _terminal

from .apps.terminal import HOSTILE
from .helpers import ROOT, cli, spawn_worker, wait_for

asyncio = pytest.mark.asyncio(loop_scope="session")

TYPE = f"t{HOSTILE}\n1  fake  line"
"""A type that would print a line of its own."""

QUEUE = "q\x1b[2J\x9b2J\rroot# \u202e"
"""A queue holds at most 63 characters."""

OBEYED = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""What a terminal (or a reader) would obey rather than show; only the newline may pass."""

SHOWN = "\\x1b[2J"
"""How the clear-screen sequence must still be seen in text output."""


def run_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return cli(
        *args, env={"PYTHONIOENCODING": "utf-8", "PGWORKER_LOG_FORMAT": "console"}, text=False
    )


def obeyed(output: bytes) -> list[str]:
    """The characters of `output` a terminal would obey, as their reprs."""
    return [repr(c) for c in OBEYED.findall(output.decode("utf-8"))]


def assert_safe(out: subprocess.CompletedProcess[bytes], *, visible: str | None = SHOWN) -> None:
    name = " ".join(str(a) for a in out.args[1:3])
    for stream in (out.stdout, out.stderr):
        assert not obeyed(stream), (name, obeyed(stream), stream[:3000])
    if visible is not None:
        assert visible in (out.stdout + out.stderr).decode(), (name, out.stdout, out.stderr)


async def hostile_rows(conn) -> dict[str, int]:
    """A failed job, a pending one and a live worker whose every text holds escape sequences,
    written by SQL (whatever enqueue would let through)."""
    failed = (await pgworker.enqueue(conn, "plain", {"k": "v"})).job.id
    pending = (await pgworker.enqueue(conn, "plain", {"k": "v"})).job.id
    dump = json.dumps({"k": HOSTILE, HOSTILE: [HOSTILE]})
    await conn.execute(
        """UPDATE pgworker.jobs SET type = $2, queue = $4, payload = $3::text::jsonb,
               result = $3::text::jsonb, progress = $3::text::jsonb, status = 'failed',
               attempts = 1, retry_count = 1, max_retries = 0, error = $2 || E'\nline 2',
               worker_id = $2,
               correlation_id = $2, idempotency_key = $2,
               claimed_at = now() - interval '1 minute',
               budget_started_at = now() - interval '1 minute',
               finished_at = now() - interval '1 second'
           WHERE id = $1""",
        failed,
        TYPE,
        dump,
        QUEUE,
    )
    await conn.execute(
        """INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id,
               correlation_id, outcome, started_at, finished_at, error_type, error_message,
               error_detail)
           SELECT id, 1, type, queue, worker_id, correlation_id, 'failed', claimed_at,
                  finished_at, $2, $2, $3
           FROM pgworker.jobs WHERE id = $1""",
        failed,
        f"E{HOSTILE}",
        f"Traceback (most recent call last):\n  {HOSTILE}\nValueError: {HOSTILE}",
    )
    await conn.execute(
        """INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail)
           VALUES ($1, 1, $2, $3::text::jsonb)""",
        failed,
        f"m{HOSTILE}",
        dump,
    )
    await conn.execute(
        """INSERT INTO pgworker.job_steps (job_id, name, result, attempt, started_at)
           VALUES ($1, $2, $3::text::jsonb, 1, now())""",
        failed,
        f"s{HOSTILE}",
        dump,
    )
    await conn.execute(
        """INSERT INTO pgworker.job_events (job_id, kind, actor, reason, detail)
           VALUES ($1, 'replay', $2, $2, $3::text::jsonb)""",
        failed,
        f"a{HOSTILE}",
        dump,
    )
    await conn.execute(
        "UPDATE pgworker.jobs SET type = $2, queue = $3 WHERE id = $1",
        pending,
        f"p{HOSTILE}",
        QUEUE,
    )
    await conn.execute(
        """INSERT INTO pgworker.workers (worker_id, hostname, pid, queues, types, concurrency)
           VALUES ($1, $1, 1, ARRAY[$2, 'default'], ARRAY[$1, 'plain'], 1)""",
        f"w{HOSTILE}",
        QUEUE,
    )
    return {"failed": failed, "pending": pending}


def test_terminal_escapes_every_control_but_the_newline_and_cell_the_newline_too():
    shown = _terminal.terminal(f"a\n{HOSTILE}\t\x00\u2066\u2069\u2028é…€")
    assert not OBEYED.findall(shown.replace("\n", ""))
    assert shown.startswith("a\n\\x1b[2J\\x1b[H\\x1b]0;owned\\x07\\x1b]8;;https://evil.example/")
    assert "\\x9b2J\\rroot@prod:~# \\u202edesrever\\x7f" in shown
    assert shown.endswith("\\t\\x00\\u2066\\u2069\\u2028é…€")
    assert _terminal.cell("a\nb\x1b") == "a\\nb\\x1b"


@asyncio
async def test_every_command_shows_the_databases_text_escaped(dsn, conn):
    ids = await hostile_rows(conn)
    failed, pending = str(ids["failed"]), str(ids["pending"])
    hostile_type = TYPE
    for args in (
        ("status",),
        ("failed", "list"),
        ("failed", "list", "--type", hostile_type, "--queue", QUEUE),
        ("show", failed),
        ("show", pending),
    ):
        out = run_cli(*args, "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        assert_safe(out)
    out = run_cli("failed", "list", "--dsn", dsn)
    lines = out.stdout.decode().splitlines()
    assert len(lines) == 3, lines  # the type's and error's newlines made none
    assert lines[1].split()[:2] == [
        failed,
        "t\\x1b[2J\\x1b[H\\x1b]0;owned\\x07\\x1b]8;;https://evil.example/\\x1b\\click\\x1b]8;;\\x1b\\\\x9b2J\\rroot@prod:~#",
    ], lines
    for args in (("status", "--json"), ("failed", "list", "--json"), ("show", failed, "--json")):
        out = run_cli(*args, "--dsn", dsn)
        assert out.returncode == 0, out.stderr
        assert_safe(out, visible="\\u001b[2J")
        assert "\\u009b2J" in out.stdout.decode()
        json.loads(out.stdout)

    # replay logs the type, queue, actor and reason on the console; a dry run prints ids only
    for dry in (["--dry-run"], []):
        out = run_cli(
            "replay", "--type", hostile_type, "--by", HOSTILE, "--reason", HOSTILE, *dry,
            "--dsn", dsn,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert_safe(out, visible=None if dry else SHOWN)
    out = run_cli("replay", pending, "--dsn", dsn)  # a pending job: a line on stderr, exit 1
    assert out.returncode == 1
    assert_safe(out, visible=None)

    # an error that quotes the database: a trigger of the user's own refuses the cancel
    await conn.execute(
        """CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN RAISE EXCEPTION '%', (SELECT type FROM pgworker.jobs WHERE id = OLD.id); END $$;
           CREATE TRIGGER refuse BEFORE UPDATE ON pgworker.jobs
               FOR EACH ROW EXECUTE FUNCTION public.refuse()"""
    )
    out = run_cli("cancel", pending, "--dsn", dsn)
    assert out.returncode == 1 and b"the database refused it" in out.stderr, out.stderr
    assert_safe(out)
    assert out.stderr.decode().count("\n") == 1, out.stderr

    out = run_cli(
        "enqueue", hostile_type, "--payload", json.dumps({HOSTILE: HOSTILE}), "--dsn", dsn
    )
    assert_safe(out, visible=None)


@asyncio
async def test_the_console_log_of_run_shows_a_handlers_error_escaped(dsn, conn, tmp_path: Path):
    job = (await pgworker.enqueue(conn, "hostile-error", {"k": HOSTILE})).job.id
    log = tmp_path / "worker.log"
    worker = spawn_worker(
        "tests.apps.terminal",
        dsn,
        log,
        "--log-format",
        "console",
        "--worker-id",
        f"w{HOSTILE}",
        env={"PYTHONIOENCODING": "utf-8"},
    )
    try:
        await wait_for(
            lambda: conn.fetchval("SELECT status = 'failed' FROM pgworker.jobs WHERE id = $1", job),
            timeout=60,
        )
        await wait_for(lambda: b"job failed" in log.read_bytes(), timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(timeout=60) == 0
        finally:
            worker.kill()
    text = log.read_bytes()
    assert not obeyed(text), (obeyed(text), text[:3000])
    assert SHOWN in text.decode() and "about to fail" in text.decode()
    for line in text.decode().splitlines():  # the error's second line stays on its log line
        assert not line.startswith("second line"), line
    out = run_cli("show", str(job), "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    assert_safe(out)


def test_the_cli_prints_only_through_say():
    """One place escapes what the CLI prints: `say`; no other print or stream write."""
    trees = [ast.parse(p.read_text()) for p in sorted((ROOT / "pgworker" / "cli").glob("*.py"))]
    [say] = [
        n for tree in trees for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "say"
    ]
    inside = {id(n) for n in ast.walk(say)}
    writes = [
        ast.unparse(n)
        for tree in trees
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and id(n) not in inside
        and (
            (isinstance(n.func, ast.Name) and n.func.id == "print")
            or (isinstance(n.func, ast.Attribute) and n.func.attr in ("write", "print_exception"))
        )
    ]
    assert writes == []
