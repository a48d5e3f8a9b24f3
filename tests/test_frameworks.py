"""The README's framework recipes (Frameworks): the FastAPI application under a real uvicorn on
127.0.0.1, and the plain script in a process of its own, against a real PostgreSQL. And the
README's blocks that name one of these files (or the example test suite) are that file's text."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import pgworker

from .docs import all_blocks
from .helpers import has_status, spawn_worker, wait_for

aio = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parent.parent


def environment(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env.update(PGWORKER_DSN=dsn, PYTHONPATH=str(ROOT))
    return env


def test_doc_blocks_are_the_examples_code():
    """A block of the README or the site whose first line names examples/fastapi_app.py,
    examples/script.py or a file of examples/testing/ is that file's text, verbatim."""
    named = set()
    for block in all_blocks():
        found = re.fullmatch(
            r"# (examples/(?:fastapi_app\.py|script\.py|testing/\S+))", block.first_line
        )
        if found is None:
            continue
        said = (ROOT / found[1]).read_text()
        assert block.rest.strip() in said, f"{block} differs from {found[1]}"
        named.add(found[1])
    assert {"examples/fastapi_app.py", "examples/script.py"} <= named
    assert any(n.startswith("examples/testing/") for n in named)


@aio
async def test_fastapi_runs_a_worker_and_enqueues_in_a_request(dsn, conn, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    log = tmp_path / "uvicorn.log"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "examples.fastapi_app:app",
            "--fd",
            str(listener.fileno()),
            "--log-level",
            "warning",
        ],
        pass_fds=[listener.fileno()],
        env=environment(dsn),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    listener.close()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            async def answers() -> bool:
                try:
                    return (await http.get("/jobs/999")).status_code == 404
                except httpx.TransportError:
                    assert server.poll() is None, log.read_text()
                    return False

            await wait_for(answers, timeout=30)
            created = await http.post("/signups", json={"email": "ada@example.org"})
            assert created.status_code == 202, created.text
            body = created.json()
            assert body["created"] is True
            job_id = body["job_id"]

            async def completed() -> bool:
                reply = (await http.get(f"/jobs/{job_id}")).json()
                return reply["status"] == "completed"

            await wait_for(completed, timeout=20)
            reply = (await http.get(f"/jobs/{job_id}")).json()
            assert reply == {
                "id": job_id,
                "status": "completed",
                "result": {"sent_to": "ada@example.org"},
            }
            again = (await http.post("/signups", json={"email": "ada@example.org"})).json()
            assert again == {"job_id": job_id, "created": False}
            refused = await http.post("/signups", json={"mail": "x"})
            assert refused.status_code == 422
            for bad in ("0", "-1", str(2**63), "x"):
                assert (await http.get(f"/jobs/{bad}")).status_code == 422
        assert await conn.fetchval("SELECT count(*) FROM pgworker.jobs") == 1
        assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 1
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert server.wait(timeout=30) in (0, -signal.SIGTERM), log.read_text()
        # The lifespan stopped the worker: it unregistered.
        assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def run_script(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "examples/script.py", *args],
        env=environment(dsn),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@aio
async def test_the_plain_script_enqueues_then_runs_its_jobs(dsn, conn, tmp_path):
    done = run_script(dsn, "ada@example.org", "bob@example.org")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "job 1 ada@example.org: enqueued",
        "job 2 bob@example.org: enqueued",
    ]
    assert [r["status"] for r in await conn.fetch("SELECT status FROM pgworker.jobs")] == [
        "pending",
        "pending",
    ]
    done = run_script(dsn, "ada@example.org", "bob@example.org", "--wait")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "job 1 ada@example.org: already enqueued",
        "job 2 bob@example.org: already enqueued",
        "job 1: completed",
        "job 2: completed",
    ]
    job = await pgworker.get_job(conn, 2)
    assert job is not None and job.result == {"sent_to": "bob@example.org"}
    # Without --wait, any worker serving the script's registry runs them.
    done = run_script(dsn, "eve@example.org", "--edition", "2027-01")
    assert done.returncode == 0, done.stderr
    eve = int(done.stdout.split()[1])
    worker = spawn_worker("examples.script", dsn, tmp_path / "worker.log")
    try:
        await wait_for(lambda: has_status(conn, eve, "completed"), timeout=30)
    finally:
        worker.terminate()
        assert worker.wait(timeout=30) == 0
    done = run_script(dsn, "nobody", "--edition", "2027-01", "--wait")
    assert done.returncode == 1
    assert re.fullmatch(
        r"job \d+: failed \(PermanentError: not an address: 'nobody'\)",
        done.stdout.splitlines()[-1],
    ), done.stdout
