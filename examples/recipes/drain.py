"""Wait until a queue is drained: `pgworker status --json` shows no pending or running job in it.

    python examples/recipes/drain.py mail --timeout 600 && kill -TERM <worker pids>

Exits 0 once the queue is drained, 1 when `--timeout` seconds passed first, 2 when `pgworker
status` fails. The DSN comes from `--dsn`, else PGWORKER_DSN or DATABASE_URL, as for `pgworker`.
Jobs scheduled for later count as pending: a queue holding one does not drain before it runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any


def status(dsn: str | None = None) -> dict[str, Any]:
    """What `pgworker status --json` prints."""
    command = [sys.executable, "-m", "pgworker", "status", "--json"]
    if dsn:
        command += ["--dsn", dsn]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def drained(found: dict[str, Any], queue: str) -> bool:
    counts = found["queues"].get(queue, {})
    return not counts.get("pending") and not counts.get("running")


def wait_until_drained(
    queue: str, *, dsn: str | None = None, timeout: float = 600.0, every: float = 2.0
) -> bool:
    """Poll `pgworker status` until `queue` has no pending or running job; False on timeout."""
    deadline = time.monotonic() + timeout
    while not drained(status(dsn), queue):
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queue", help="the queue to wait for")
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: $PGWORKER_DSN, else $DATABASE_URL)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default: 600)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between polls")
    args = parser.parse_args(argv)
    try:
        ok = wait_until_drained(args.queue, dsn=args.dsn, timeout=args.timeout, every=args.every)
    except subprocess.CalledProcessError as exc:
        print(f"drain: pgworker status failed: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    print(f"queue {args.queue}: " + ("drained" if ok else f"not drained after {args.timeout:g}s"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
