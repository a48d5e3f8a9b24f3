"""`--profile`: py-spy on one more pgworker drain, outside the table, and the summary of its
collapsed stacks that the report prints."""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

from bench.measure import BIN, BenchError, Resources, wait_quiet
from bench.systems import SYSTEMS, PgWorker
from bench.workloads import drain


def summarise_raw(path: Path, top: int = 15) -> dict[str, Any]:
    """Own (leaf) and cumulative (anywhere on the stack, once per sample) shares of py-spy's
    collapsed stacks ("frame;frame;... count" per line)."""
    own: Counter[str] = Counter()
    cum: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += c
        own[frames[-1]] += c
        for f in set(frames):
            cum[f] += c

    def rows(counter: Counter[str], n: int = top) -> list[tuple[str, float]]:
        return [(f, 100.0 * c / total) for f, c in counter.most_common(n)]

    packages: Counter[str] = Counter()
    for f, c in own.items():
        packages[package_of(f)] += c
    mine = Counter({f: c for f, c in cum.items() if "(pgworker/" in f})
    return {
        "samples": total,
        "own": rows(own),
        "cumulative": rows(cum),
        "own_by_package": rows(packages, 12),
        "pgworker_cumulative": rows(mine, 20),
    }


def package_of(frame: str) -> str:
    """'func (asyncpg/connection.py)' -> 'asyncpg'; the standard library's modules by name."""
    m = re.search(r"\(([^)]*)\)\s*$", frame)
    path = m.group(1) if m else frame
    head = path.split("/")[0]
    return head.removesuffix(".py") if head else path


async def profile(res: Resources, args: argparse.Namespace) -> dict[str, Any]:
    system = SYSTEMS["pgworker"]
    assert isinstance(system, PgWorker)
    db = "bench_pgworker_profile"
    dsn = await res.create_db(db)
    raw = args.results / "pyspy-pgworker.txt"
    raw.unlink(missing_ok=True)
    try:
        await system.setup(dsn)
        await system.enqueue_bulk(dsn, args.profile_n, args.chunk)
        await wait_quiet(args.quiet_wait, args.quiet_cores)

        async def record(proc: subprocess.Popen, dsn: str, exclude: set[int]) -> dict:
            # Attach once the worker is processing (imports and start-up left out).
            conn = await asyncpg.connect(dsn)
            exclude.add(conn.get_server_pid())
            try:
                while not await conn.fetchval(system.served_sql):
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()
            spy = await asyncio.create_subprocess_exec(
                str(BIN / "py-spy"),
                "record",
                "--pid",
                str(proc.pid),
                "--duration",
                str(args.profile_seconds),
                "--rate",
                "250",
                "--nonblocking",
                "--nolineno",
                "--format",
                "raw",
                "--output",
                str(raw),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            res.procs[spy.pid] = "py-spy"
            try:
                out, _ = await asyncio.wait_for(spy.communicate(), args.profile_seconds + 30)
            finally:
                res.procs.pop(spy.pid, None)
            return {"returncode": spy.returncode, "output": out.decode(errors="replace")[-2000:]}

        result = await drain(
            res,
            system,
            dsn,
            args.profile_n,
            args.results / "logs" / "profile-pgworker.log",
            args.timeout,
            on_started=record,
        )
    finally:
        await res.drop_db(db)
    spy = result.pop("extra") or {}
    if not raw.exists():
        raise BenchError(f"py-spy wrote nothing: {spy.get('output', '')}")
    summary = summarise_raw(raw)
    summary["processing_jps_while_sampled"] = result["processing_jps"]
    summary["py_spy"] = spy
    return summary
