"""W2's producer: enqueue latency jobs one at a time at a fixed rate, each carrying its enqueue
wall time (taken just before the library's enqueue call), from a process of its own.

    python -m bench.paced --system pgworker --dsn DSN --rate 50 --count 500

Prints one JSON line: how many were sent, over how long, and how far behind schedule it fell.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.systems import SYSTEMS


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    p.add_argument("--dsn", required=True)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--count", type=int, default=500)
    a = p.parse_args()
    system = SYSTEMS[a.system]
    handle = await system.open_single(a.dsn)
    lag_max = 0.0
    try:
        t0 = time.monotonic()
        for i in range(a.count):
            due = t0 + i / a.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                lag_max = max(lag_max, -delay)
            await system.enqueue_one(handle, time.time())
        elapsed = time.monotonic() - t0
    finally:
        await system.close_single(handle)
    print(json.dumps({"sent": a.count, "seconds": round(elapsed, 3), "max_lag_s": lag_max}))


if __name__ == "__main__":
    asyncio.run(main())
