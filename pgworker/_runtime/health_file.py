"""The health file of `pgworker run --health-file PATH`, for container probes: the worker rewrites
it at each heartbeat with `Worker.health()`, and `pgworker health` judges it.

A file rather than an HTTP endpoint: an exec probe (Docker's HEALTHCHECK, a Kubernetes exec
probe) needs no port and no listener in the worker, and a worker whose event loop is stuck stops
rewriting the file, which is exactly what makes it stale. The file is replaced by a rename, so a
reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._validate import MAX_LEASE

HEALTHY_STATES = ("ok", "retrying")
MAX_BYTES = 1024 * 1024
"""The most bytes `judge` reads: a worker's file is a few hundred; a larger one is not its."""


def record(
    worker_id: str, lease: float, services: Mapping[str, Mapping[str, Any]], stopping: bool
) -> dict[str, Any]:
    """What the file holds: the services' health (datetimes as ISO 8601), the lease that bounds
    the file's age, and when it was written."""
    return {
        "written_at": datetime.now(UTC).isoformat(),
        "lease": lease,
        "worker_id": worker_id,
        "pid": os.getpid(),
        "stopping": stopping,
        "services": {
            name: {k: v.isoformat() if isinstance(v, datetime) else v for k, v in health.items()}
            for name, health in services.items()
        },
    }


def write(path: str, content: Mapping[str, Any]) -> None:
    """Replace the file at `path` with `content` as JSON, atomically: a temporary file in the same
    directory, renamed over it. Raises OSError when the directory cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=".pgworker-health-", dir=directory)
    try:
        os.fchmod(fd, 0o644)  # a probe may run as another user than the worker
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(content, out, default=str)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    reason: str
    """One line: what is wrong, or the services' states when all is well."""


def judge(path: str, now: datetime | None = None) -> Verdict:
    """Healthy only when the file at `path` was written less than its lease ago and every
    service in it is `ok` or `retrying`."""
    try:
        text = _read(path)
    except FileNotFoundError:
        return Verdict(
            False, f"no health file at {path} (is `pgworker run --health-file {path}` running?)"
        )
    except (OSError, UnicodeDecodeError) as exc:
        return Verdict(False, f"cannot read {path}: {exc}")
    if text is None:
        return Verdict(
            False,
            f"{path} is not a pgworker health file (not a regular file, or "
            f"over {MAX_BYTES:,} bytes)",
        )
    try:
        content = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Verdict(False, f"{path} holds unreadable JSON ({exc})")
    parsed = _parse(content)
    if isinstance(parsed, str):
        return Verdict(False, f"{path} is not a pgworker health file ({parsed})")
    written_at, lease, services, stopping = parsed
    age = ((now or datetime.now(UTC)) - written_at).total_seconds()
    if age >= lease:
        return Verdict(
            False,
            f"{path} is stale by {_seconds(age - lease)} s (written {_seconds(age)} s ago, "
            f"lease {lease:g} s): the worker is stuck or gone",
        )
    bad = {name: state for name, state in services.items() if state not in HEALTHY_STATES}
    if not services:
        return Verdict(False, f"{path} lists no service: the worker has not started serving")
    if age < -lease:  # else a file dated 9999 would never go stale
        return Verdict(
            False, f"{path} says it was written {_seconds(-age)} s in the future: not the worker's"
        )
    age = max(0.0, age)
    if bad:
        listed = ", ".join(f"{name} {state}" for name, state in bad.items())
        why = f"service {listed}" if len(bad) == 1 else f"services {listed}"
        return Verdict(False, why + (" (the worker is stopping)" if stopping else ""))
    states = ", ".join(f"{name} {state}" for name, state in services.items())
    return Verdict(True, f"written {_seconds(age)} s ago; {states}")


def _read(path: str) -> str | None:
    """The file's text; None when it is not a regular file or is over MAX_BYTES. Opened without
    blocking (a FIFO at `path` would hang a probe) and read no further than MAX_BYTES (a path
    turned into /dev/zero or a huge file would fill memory)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(MAX_BYTES + 1)
    return None if len(data) > MAX_BYTES else data.decode("utf-8")


def _parse(content: Any) -> tuple[datetime, float, dict[str, str], bool] | str:
    """The fields `judge` needs, or what is wrong with them."""
    if not isinstance(content, dict):
        return "not a JSON object"
    try:
        written_at = datetime.fromisoformat(content["written_at"])
    except (KeyError, TypeError, ValueError):
        return "no valid written_at"
    if written_at.tzinfo is None:
        return "written_at has no time zone"
    lease = content.get("lease")
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
        return "no valid lease"
    if not math.isfinite(lease) or lease > MAX_LEASE:
        return "no valid lease"
    services = content.get("services")
    if not isinstance(services, dict) or not all(
        isinstance(s, dict) and isinstance(s.get("state"), str) for s in services.values()
    ):
        return "no valid services"
    return (
        written_at,
        float(lease),
        {_printable(n): _printable(s["state"]) for n, s in services.items()},
        content.get("stopping") is True,
    )


def _printable(text: str) -> str:
    """`text` as a line can print it: a lone surrogate (JSON's "\\ud800") escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
