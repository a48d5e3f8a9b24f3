"""The workloads: W1 (bulk enqueue, then one worker drains), W2 (wake-up latency of an idle
worker), W4 (pgworker on a grown table), W5 (pgworker with the fleet's features in the table),
and the drain they share. W3, the floor, is W1 run on the system `floor`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.measure import (
    OTHERS_SQL,
    REPO,
    BenchError,
    Resources,
    interp,
    launch,
    log,
    postmaster_of,
    stop,
    tail,
    wait_quiet,
)
from bench.procstat import CpuMeter
from bench.systems import GROWTH, SYSTEMS, PgWorker, System
from bench.systems.pgworker import FLEET_UNFINISHED_SQL

POLL_S = 0.02  # completion poll
# The drain's database's server sessions but the benchmark's own (sampled with the CPU): the
# worker's, or its pooler's.
CONNECTIONS_SQL = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
CPU_SAMPLE_S = 0.1  # /proc sample (interpolated at the interval's ends)


async def quiet(args: argparse.Namespace) -> None:
    await wait_quiet(args.quiet_wait, args.quiet_cores)


async def drain(
    res: Resources,
    system: System,
    dsn: str,
    n: int,
    log_path: Path,
    timeout: float,
    on_started: Any = None,
) -> dict[str, Any]:
    """Start one worker on a table holding n pending jobs, wait until none is left, and return
    the processing rate and the CPU used between the first start and the last completion."""
    poll = await asyncpg.connect(dsn)
    try:
        meter = CpuMeter(postmaster=postmaster_of(poll), exclude={poll.get_server_pid()})
        meter.side = system.side_pid()
        connections = 0
        since = time.time()
        proc = launch(res, system.worker_argv(dsn), dsn, log_path, None, system.src)
        meter.root = proc.pid
        samples = [(time.time(), *meter.sample())]
        last_sample = samples[0][0]
        last_noise, others = 0.0, 0
        deadline = time.monotonic() + timeout
        extra = None
        if on_started is not None:
            extra = asyncio.create_task(on_started(proc, dsn, meter.exclude))
        try:
            while True:
                if proc.poll() is not None:
                    raise BenchError(
                        f"{system.name} worker exited with {proc.returncode}:\n{tail(log_path)}"
                    )
                unfinished = await poll.fetchval(system.unfinished_sql)
                now = time.time()
                if now - last_noise >= 1.0:
                    others = max(others, await poll.fetchval(OTHERS_SQL))
                    last_noise = now
                if now - last_sample >= CPU_SAMPLE_S or not unfinished:
                    samples.append((now, *meter.sample()))
                    last_sample = now
                    connections = max(connections, await poll.fetchval(CONNECTIONS_SQL))
                if not unfinished:
                    polled_end = now
                    break
                if time.monotonic() > deadline:
                    raise BenchError(f"{system.name}: drain of {n} jobs not done in {timeout}s")
                await asyncio.sleep(POLL_S)
            extra_result = await extra if extra is not None else None
            await asyncio.sleep(0.2)
            samples.append((time.time(), *meter.sample()))
            iv = await system.interval(poll, since)
        finally:
            if extra is not None and not extra.done():
                extra.cancel()
            await stop(res, proc)
    finally:
        await poll.close()
    if iv.start is None:
        raise BenchError(f"{system.name}: no start timestamp found")
    end = iv.end if (system.end_from_db and iv.end is not None) else polled_end
    span = end - iv.start
    worker_cpu, pg_cpu, self_cpu, busy, side_cpu = (
        interp(samples, end, i) - interp(samples, iv.start, i) for i in (1, 2, 3, 4, 5)
    )
    # What else kept the machine's cores busy meanwhile (other programs, other clusters).
    other_cores = max(busy - worker_cpu - pg_cpu - self_cpu - side_cpu, 0.0) / span
    return {
        "processing_jps": n / span,
        "processing_s": span,
        "processing_jps_poll_end": n / (polled_end - iv.start),
        "worker_cpu_ms_per_1k": worker_cpu * 1e6 / n,
        "pg_cpu_ms_per_1k": pg_cpu * 1e6 / n,
        "pooler_cpu_ms_per_1k": side_cpu * 1e6 / n if meter.side is not None else None,
        "server_connections_max": connections,
        "interval_from": iv.how if system.end_from_db else "start: database; end: 20 ms poll",
        "other_active_backends_max": others,
        "bench_cpu_ms_per_1k": self_cpu * 1e6 / n,
        "other_cpu_cores": other_cores,
        "extra": extra_result,
    }


# --- W1: bulk enqueue, then one worker drains ---------------------------------------------------


async def w1(res: Resources, args: argparse.Namespace, system: System, dsn: str, tag: str) -> dict:
    await quiet(args)
    enqueue_s = await system.enqueue_bulk(dsn, args.n, args.chunk)
    log(f"  {system.name}: enqueued {args.n} in {enqueue_s:.2f}s ({args.n / enqueue_s:,.0f}/s)")
    out = await drain(
        res, system, dsn, args.n, args.results / "logs" / f"{tag}-w1.log", args.timeout
    )
    out["enqueue_jps"] = args.n / enqueue_s
    out.pop("extra", None)
    out["check"] = await system.check(dsn, args.n)
    out.update(await system.drain_figures(dsn, args.n))
    log(
        f"  {system.name}: processed at {out['processing_jps']:,.0f}/s "
        f"(worker {out['worker_cpu_ms_per_1k']:.0f} ms/1k, "
        f"PostgreSQL {out['pg_cpu_ms_per_1k']:.0f} ms/1k"
        + (
            f", PgBouncer {out['pooler_cpu_ms_per_1k']:.0f} ms/1k"
            if out["pooler_cpu_ms_per_1k"] is not None
            else ""
        )
        + f"; {out['server_connections_max']} server connections at most; other programs "
        f"{out['other_cpu_cores']:.2f} cores); {out['check']}"
    )
    return out


# --- W2: wake-up latency of an idle worker -------------------------------------------------------


def read_latencies(path: Path) -> list[tuple[float, float]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), float(parts[1])))
    return out


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def paced(res: Resources, args: argparse.Namespace, system: System, dsn: str) -> dict:
    """Run bench/paced.py (the W2 producer) to its end; returns the JSON line it prints."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.paced",
        "--system",
        system.name,
        "--dsn",
        dsn,
        "--rate",
        str(args.rate),
        "--count",
        str(args.latency_count),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    res.procs[proc.pid] = "bench.paced"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), args.latency_count / args.rate + 60)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        res.procs.pop(proc.pid, None)
    if proc.returncode != 0:
        raise BenchError(f"{system.name}: paced producer failed:\n{out.decode()}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def w2(res: Resources, args: argparse.Namespace, system: System, dsn: str, tag: str) -> dict:
    path = args.results / "tmp" / f"{tag}-latency.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    log_path = args.results / "logs" / f"{tag}-w2.log"
    await quiet(args)
    proc = launch(
        res,
        system.latency_argv(dsn),
        dsn,
        log_path,
        {"BENCH_LATENCY_FILE": str(path)},
        system.src,
    )
    handle = await system.open_single(dsn)
    try:
        # Ready = it has run a warm-up job; then it is left idle for a second.
        deadline = time.monotonic() + 60
        while not read_latencies(path):
            if proc.poll() is not None:
                raise BenchError(f"{system.name} worker exited:\n{tail(log_path)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{system.name}: worker not ready after 60s:\n{tail(log_path)}")
            await system.enqueue_one(handle, time.time())
            for _ in range(10):
                await asyncio.sleep(0.05)
                if read_latencies(path):
                    break
        await asyncio.sleep(1.0)
        begin = time.time()
        producer = await paced(res, args, system, dsn)
        deadline = time.monotonic() + 30
        while True:
            got = [lat for t, lat in read_latencies(path) if t >= begin]
            if len(got) >= args.latency_count or time.monotonic() > deadline:
                break
            if proc.poll() is not None:
                raise BenchError(f"{system.name} worker exited:\n{tail(log_path)}")
            await asyncio.sleep(0.1)
    finally:
        await system.close_single(handle)
        await stop(res, proc)
    if len(got) < args.latency_count:
        raise BenchError(f"{system.name}: only {len(got)}/{args.latency_count} latency jobs ran")
    ms = [x * 1000 for x in got]
    out = {
        "latency_p50_ms": percentile(ms, 50),
        "latency_p95_ms": percentile(ms, 95),
        "latency_p99_ms": percentile(ms, 99),
        "latency_max_ms": max(ms),
        "latency_jobs": len(ms),
        "producer_max_lag_s": producer["max_lag_s"],
    }
    log(
        f"  {system.name}: wake-up p50 {out['latency_p50_ms']:.1f} ms, "
        f"p95 {out['latency_p95_ms']:.1f} ms, p99 {out['latency_p99_ms']:.1f} ms"
    )
    return out


# --- W4: pgworker on a table grown to 1M finished jobs ------------------------------------------


async def w4(res: Resources, args: argparse.Namespace, dsn: str, tag: str) -> dict:
    system = SYSTEMS[GROWTH]
    assert isinstance(system, PgWorker)
    await system.setup(dsn)
    prefill_s, max_id, size = await system.prefill(dsn, args.growth_rows)
    log(f"  pgworker@{args.growth_rows:,}: prefilled in {prefill_s:.1f}s ({size})")
    await quiet(args)
    enqueue_s = await system.enqueue_bulk(dsn, args.n, args.chunk)
    explain = await system.explain_claim(dsn)
    out = await drain(
        res, system, dsn, args.n, args.results / "logs" / f"{tag}-w4.log", args.timeout
    )
    out.pop("extra", None)
    out["enqueue_jps"] = args.n / enqueue_s
    out["check"] = await system.check(dsn, args.n, after_id=max_id)
    out["prefill_s"] = prefill_s
    out["tables_size"] = size
    out["explain"] = explain
    log(
        f"  pgworker@{args.growth_rows:,}: processed at {out['processing_jps']:,.0f}/s; "
        f"claim scans: {explain['custom plan']['scans']}; {out['check']}"
    )
    return out


# --- W5: pgworker with the fleet's features in the table ----------------------------------------


async def w5(res: Resources, args: argparse.Namespace, system: System, dsn: str, tag: str) -> dict:
    """W1's drain of N plain `noop` jobs, on a table seeded first with what a fleet's other work
    leaves there (bench/systems/pgworker.py, FLEET_SQL): a drain is over when none of the `noop`
    jobs due is pending or running, and the check reads only the N jobs."""
    assert isinstance(system, PgWorker)
    await system.setup(dsn)
    prefill_s, max_id, seeded = await system.prefill_fleet(dsn)
    log(
        f"  {system.name}@fleet: seeded in {prefill_s:.1f}s: "
        + ", ".join(f"{n:,} {k}" for k, n in seeded.items())
    )
    await quiet(args)
    enqueue_s = await system.enqueue_bulk(dsn, args.n, args.chunk)
    explain = await system.explain_claim(dsn)
    scoped = copy.copy(system)
    scoped.unfinished_sql = FLEET_UNFINISHED_SQL
    out = await drain(
        res, scoped, dsn, args.n, args.results / "logs" / f"{tag}-w5.log", args.timeout
    )
    out.pop("extra", None)
    out["enqueue_jps"] = args.n / enqueue_s
    out["check"] = await system.check(dsn, args.n, after_id=max_id)
    out.update(await system.drain_figures(dsn, args.n, after_id=max_id))
    out["prefill_s"] = prefill_s
    out["seeded"] = seeded
    out["fleet_explain"] = explain
    log(
        f"  {system.name}@fleet: processed at {out['processing_jps']:,.0f}/s "
        f"(worker {out['worker_cpu_ms_per_1k']:.0f} ms/1k, "
        f"PostgreSQL {out['pg_cpu_ms_per_1k']:.0f} ms/1k; other programs "
        f"{out['other_cpu_cores']:.2f} cores); claim scans: "
        f"{explain['generic plan']['scans']}; {out['check']}"
    )
    return out
