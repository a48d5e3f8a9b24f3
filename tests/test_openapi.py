"""A property-based run of the OpenAPI document (schemathesis) against a live `pgworker serve`:
bounded examples of every operation, valid and invalid, and not one server error (5xx)."""

from __future__ import annotations

import sys
from typing import Any

import anyio
import httpx
import pytest

import pgworker

from .webserver import Served, server

pytestmark = pytest.mark.asyncio(loop_scope="session")
__all__ = ["server"]  # the fixture, used by name

EXAMPLES = 25
"""Test cases per operation and phase: the run stays under a minute."""


async def test_openapi_document_describes_every_route(server: Served) -> None:
    async with server.client() as c:
        document = (await c.get("/openapi.json")).json()
    operations = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert {
        ("POST", "/jobs"),
        ("GET", "/jobs"),
        ("POST", "/jobs/claim"),
        ("GET", "/jobs/{id}"),
        ("POST", "/jobs/{id}/heartbeat"),
        ("POST", "/jobs/{id}/complete"),
        ("POST", "/jobs/{id}/fail"),
        ("POST", "/jobs/{id}/cancel"),
        ("POST", "/jobs/{id}/replay"),
        ("GET", "/queues"),
        ("GET", "/workers"),
        ("GET", "/healthz"),
    } <= operations
    assert "bearer" in str(document["components"]["securitySchemes"]).lower()


async def test_schemathesis_finds_no_server_error(server: Served, conn: Any, tmp_path: Any) -> None:
    # Some jobs in every state, so that generated ids reach real rows now and then.
    for n in range(1, 6):
        await pgworker.enqueue(conn, "t", {"n": n})
    async with server.client() as c:
        claimed = (await c.post("/jobs/claim", json={"worker_id": "w"})).json()
        await c.post(f"/jobs/{claimed['id']}/fail", json={**_held(claimed), "error": "e"})
        await c.post("/jobs/2/cancel")
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{server.url}/openapi.json",
        "--header",
        f"Authorization: Bearer {server.token}",
        "--checks",
        "not_a_server_error",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        "14",
        "--workers",
        "1",
        "--phases",
        "examples,coverage,fuzzing",
        "--generation-database",
        "none",
        "--request-timeout",
        "20",
        "--no-color",
    ]
    with anyio.fail_after(300):
        done = await anyio.run_process(command, check=False, cwd=tmp_path)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, out[-6000:] + done.stderr.decode(errors="replace")[-2000:]
    assert " passed" in out
    async with httpx.AsyncClient(base_url=server.url) as c:
        assert (await c.get("/healthz")).status_code == 200


def _held(job: dict[str, Any]) -> dict[str, Any]:
    return {"worker_id": job["worker_id"], "attempt": job["attempt"]}
