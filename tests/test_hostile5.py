"""Hostile users, fifth round: the surfaces of issues 14 and 15 (the HTTP API of `pgworker serve`,
the dashboard, metrics, the health file, pgworker.testing) attacked by clients, files and
handlers. Each test states what must hold, and failed before its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def health(path: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """`pgworker health --health-file PATH`, bounded: a probe that hangs fails the test."""
    return subprocess.run(
        [sys.executable, "-m", "pgworker", "health", "--health-file", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def fresh(**changes: object) -> str:
    content: dict[str, object] = {
        "written_at": datetime.now(UTC).isoformat(),
        "lease": 30,
        "worker_id": "w",
        "pid": 1,
        "stopping": False,
        "services": {"producer": {"state": "ok"}},
    }
    return json.dumps({**content, **changes})


# --- the health file --------------------------------------------------------------------------


def test_a_fifo_at_the_health_file_path_is_unhealthy_at_once_not_a_hung_probe(tmp_path):
    """open() of a FIFO blocks until a writer comes: the probe hung (till its own timeout)."""
    path = tmp_path / "health.json"
    os.mkfifo(path)
    out = health(path, timeout=10)
    assert out.returncode == 1
    assert "not a regular file" in out.stderr


def test_a_health_file_turned_into_an_endless_file_is_unhealthy_without_reading_it_all(tmp_path):
    """A symlink to /dev/zero (or a huge file): the probe read it all into memory, forever."""
    path = tmp_path / "health.json"
    path.symlink_to("/dev/zero")
    out = health(path, timeout=10)
    assert out.returncode == 1 and "not a regular file" in out.stderr
    big = tmp_path / "big.json"
    big.write_text(fresh()[:-1] + ', "x": "' + "a" * (2 * 1024 * 1024) + '"}')
    out = health(big)
    assert out.returncode == 1 and "over 1,048,576 bytes" in out.stderr


def test_a_symlink_to_a_fresh_file_is_still_judged_and_a_directory_is_unhealthy(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(fresh())
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert health(link).returncode == 0
    directory = tmp_path / "dir"
    directory.mkdir()
    out = health(directory)
    assert out.returncode == 1 and out.stderr.startswith("pgworker health: unhealthy: ")


@pytest.mark.parametrize(
    "content",
    [
        fresh(written_at="9999-12-31T00:00:00+00:00"),
        fresh(written_at=(datetime.now(UTC) + timedelta(days=1)).isoformat()),
        fresh(written_at="2000-01-01T00:00:00+00:00", lease=1e300),
    ],
    ids=["year-9999", "a-day-ahead", "lease-1e300"],
)
def test_a_garbage_health_file_that_never_goes_stale_is_unhealthy(tmp_path, content):
    """A written_at in the future counted as written 0 s ago, and a lease of 1e300 never ran
    out: a file replaced by such garbage said healthy forever, whatever the worker did."""
    path = tmp_path / "health.json"
    path.write_text(content)
    out = health(path)
    assert out.returncode == 1, out.stdout
