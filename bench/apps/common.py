"""What the latency handlers share: append `enqueued_at started-enqueued_at` (epoch seconds,
seconds) to the file named by $BENCH_LATENCY_FILE, one line per job, written as it happens (no
buffering across jobs, so a worker that is killed loses nothing already recorded)."""

from __future__ import annotations

import os
import time

_file = None


def record_latency(enqueued_at: float) -> None:
    started = time.time()
    global _file
    if _file is None:
        path = os.environ.get("BENCH_LATENCY_FILE")
        if not path:
            return
        _file = open(path, "a", buffering=1)  # noqa: SIM115 - kept open for the process
    _file.write(f"{enqueued_at:.6f} {started - enqueued_at:.6f}\n")
