"""A real `pgworker serve` for tests: a subprocess on 127.0.0.1 and a free port, against a test
database, ready once /healthz answers."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import pytest_asyncio

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-0123456789"
READY_WITHIN = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running `pgworker serve`: its base URL, the token it accepts, the process and its log."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path
    headers: dict[str, str] = field(default_factory=dict)

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An httpx client for this server, sending the token."""
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, **kwargs)  # type: ignore[arg-type]

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def _environment(env: dict[str, str] | None) -> dict[str, str]:
    drop = ("PGWORKER_DSN", "DATABASE_URL", "PGWORKER_API_TOKEN")
    environment = {k: v for k, v in os.environ.items() if k not in drop}
    environment.update({"PYTHONPATH": str(ROOT), **(env or {})})
    return environment


async def _ready(served: Served, deadline: float) -> None:
    async with httpx.AsyncClient(base_url=served.url) as client:
        while True:
            if served.process.poll() is not None:
                raise AssertionError(
                    f"pgworker serve exited with {served.process.returncode}:\n{served.stderr()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/healthz", timeout=2)).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"pgworker serve not ready in time:\n{served.stderr()}")
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def serving(
    dsn: str,
    *args: str,
    token: str | None = TOKEN,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Served]:
    """`pgworker serve --dsn DSN ARGS` on 127.0.0.1 and a free port (with `--token token` unless
    None), ready when it yields; stopped with SIGTERM (then killed) when the block ends."""
    log = Path(tempfile.mkstemp(prefix="pgw-serve-", suffix=".log")[1])
    for _ in range(3):  # the free port may be taken between finding it and binding it
        port = free_port()
        command: list[str] = [sys.executable, "-m", "pgworker", "serve", "--dsn", dsn]
        command += ["--host", "127.0.0.1", "--port", str(port), *args]
        if token is not None:
            command += ["--token", token]
        process = _spawn(command, log, env)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        served = Served(f"http://127.0.0.1:{port}", token or "", process, log, headers)
        try:
            await _ready(served, time.monotonic() + READY_WITHIN)
        except AssertionError:
            _stop(process)
            if "address already in use" in served.stderr().lower():
                continue
            raise
        break
    try:
        yield served
    finally:
        _stop(process)
        _forget(log)


def _spawn(command: list[str], log: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=err, env=_environment(env), cwd=ROOT
        )


def _forget(log: Path) -> None:
    log.unlink(missing_ok=True)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def run_serve(dsn: str, *args: str, env: dict[str, str] | None = None, timeout: float = 30):
    """Run `pgworker serve` to its end (one that refuses to start): the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "pgworker", "serve", "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        env=_environment(env),
        cwd=ROOT,
        timeout=timeout,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def server(dsn: str) -> AsyncIterator[Served]:
    """A `pgworker serve` of this test's own database, with the token TOKEN."""
    async with serving(dsn) as served:
        yield served
