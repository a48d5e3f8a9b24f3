"""The pressure harness's producer: offers `pressure` jobs at a rate, from a process of its own.

    python -m bench.pressure.enqueuer --dsn DSN --rate 800 [--tick-ms 10]

Open loop: every tick it enqueues, in one `pgworker.enqueue_many` call (one transaction, one
notification), the jobs that fell due since the last one at the current rate, whatever the
worker does; an enqueue that takes longer than a tick makes the next batch larger rather than
the offered rate lower. Each job's run_at is its enqueue's database time, which is what the
harness measures pickup from (the claim's time minus run_at, the attempt row's wait_ms).

Reads commands on stdin, one a line: `rate R` (jobs per second, 0 pauses) and `stop` (also on
end of file). Prints one JSON line a second on stdout: the time, the jobs enqueued so far, the
rate, and the most jobs beyond one tick's worth that were due at a tick since the last line
(how far the producer itself fell behind its schedule)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time

import asyncpg

import pgworker

TYPE = "pressure"
MOST_PER_CALL = 2000
"""The most jobs in one enqueue call: a producer far behind catches up in several."""


class State:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.stop = asyncio.Event()


async def commands(state: State) -> None:
    """Apply `rate R` and `stop` from stdin; end of file stops too."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().split()
        if not line or line[0] == "stop":
            state.stop.set()
            return
        if line[0] == "rate" and len(line) == 2:
            state.rate = max(float(line[1]), 0.0)


def report(sent: int, rate: float, behind: float) -> None:
    line = {"t": time.time(), "sent": sent, "rate": rate, "behind": round(behind, 1)}
    print(json.dumps(line), flush=True)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--rate", type=float, default=800.0)
    p.add_argument("--tick-ms", type=float, default=10.0)
    a = p.parse_args()
    state = State(a.rate)
    control = asyncio.create_task(commands(state))
    conn = await asyncpg.connect(a.dsn)
    tick = a.tick_ms / 1000
    sent, credit, behind = 0, 0.0, 0.0
    try:
        last = next_tick = last_report = time.monotonic()
        while not state.stop.is_set():
            now = time.monotonic()
            credit += state.rate * (now - last)
            last = now
            behind = max(behind, credit - state.rate * tick)
            while credit >= 1 and not state.stop.is_set():
                n = min(int(credit), MOST_PER_CALL)
                await pgworker.enqueue_many(conn, [pgworker.JobSpec(TYPE, {}) for _ in range(n)])
                credit -= n
                sent += n
            if now - last_report >= 1.0:
                report(sent, state.rate, behind)
                last_report, behind = now, 0.0
            next_tick = max(next_tick + tick, time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.stop.wait(), next_tick - time.monotonic())
    finally:
        report(sent, state.rate, behind)
        control.cancel()
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
