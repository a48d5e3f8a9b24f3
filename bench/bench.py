"""pgworker against its peers (procrastinate, pgqueuer, chancy) and against the floor (raw
asyncpg, no library), on one PostgreSQL server. See bench/README.md for what each figure means.

    python bench/bench.py [--n 20000] [--runs 3] [--systems pgworker,procrastinate,...]
                          [--workloads w1,w2,w3,w4,w5] [--profile]

Each system gets a fresh database per run (bench_<system>_<run>), dropped at the end; runs
alternate systems (run 1: every system in order, run 2: every system, ...). Everything started
here (workers, the paced producer, py-spy) is stopped and every database dropped on exit, on an
error and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Run as `python bench/bench.py`, Python puts bench/ first on the path, where `import bench`
# would find this file instead of the package: import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(REPO))

import asyncpg  # noqa: E402

from bench.measure import BenchError, Resources, git_rev, log, versions  # noqa: E402
from bench.profiling import profile  # noqa: E402
from bench.report import FLEET, footnotes, medians, render  # noqa: E402
from bench.systems import BASE, CONCURRENCY, LIB_SYSTEMS, OPTIONAL, SYSTEMS  # noqa: E402
from bench.workloads import w1, w2, w4, w5  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
WORKLOADS = ("w1", "w2", "w3", "w4", "w5")
DEFAULT_WORKLOADS = ("w1", "w2", "w3", "w4", "w5")

LOCK_KEY = 0x7067_6265_6E63  # one benchmark at a time per server


async def measure(
    res: Resources,
    args: argparse.Namespace,
    name: str,
    db: str,
    tag: str,
    failures: list[str],
    run: int,
) -> dict[str, Any]:
    """One system's figures in a fresh database: W1 then W2 (or W3, or W4)."""
    try:
        dsn = await res.create_db(db)
        try:
            if name == "pgworker@growth":
                return await w4(res, args, dsn, tag)
            if name.endswith("@fleet"):
                return await w5(res, args, SYSTEMS[name.removesuffix("@fleet")], dsn, tag)
            system = SYSTEMS[name]
            await system.setup(dsn)
            out: dict[str, Any] = {}
            if "w1" in args.workloads or name == "floor":
                out.update(await w1(res, args, system, dsn, tag))
            if "w2" in args.workloads and system.supports_latency:
                out.update(await w2(res, args, system, dsn, tag))
            return out
        finally:
            await res.drop_db(db)
    except (BenchError, asyncpg.PostgresError, OSError, RuntimeError) as exc:
        what = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"  {name}: FAILED: {what}")
        failures.append(f"run {run} {name}: {what}")
        return {"error": what}


async def hold_lock(dsn: str) -> asyncpg.Connection:
    """Two benchmarks on one server would drop each other's databases and share its CPU: take
    a session advisory lock for the whole run, waiting for another run to finish."""
    conn = await asyncpg.connect(dsn)
    if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
        log("another benchmark is running on this server: waiting for it to finish")
        await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    return conn


async def amain(args: argparse.Namespace, res: Resources) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    args.results.mkdir(parents=True, exist_ok=True)
    lock = await hold_lock(args.dsn)
    try:
        return await run_all(args, res)
    finally:
        await lock.close()


async def run_all(args: argparse.Namespace, res: Resources) -> int:
    rev_at_start = git_rev()
    vers = await versions(args.dsn, {name: SYSTEMS[name].src for name in ("pgworker", BASE)})
    log("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    runs: list[dict[str, Any]] = []
    explain = fleet_explain = None
    failures: list[str] = []
    for run in range(1, args.runs + 1):
        entry: dict[str, Any] = {"run": run, "systems": {}}
        runs.append(entry)
        plan = []
        if "w1" in args.workloads or "w2" in args.workloads:
            plan += [s for s in args.systems]
        if "w3" in args.workloads:
            plan.append("floor")
        if "w4" in args.workloads:
            plan.append("pgworker@growth")
        if "w5" in args.workloads:
            plan += [f"{s}@fleet" for s in FLEET if s in args.systems]
        for name in plan:
            tag = f"run{run}-{name.replace('@', '-')}"
            db = f"bench_{name.replace('@', '_')}_{run}"
            discarded: list[dict[str, Any]] = []
            for attempt in range(args.noisy_retries + 1):
                log(f"run {run}/{args.runs}: {name}" + (f" (again, {attempt})" if attempt else ""))
                out = await measure(res, args, name, db, tag, failures, run)
                if "explain" in out:
                    explain = out.pop("explain")
                if "fleet_explain" in out:
                    fleet_explain = out.pop("fleet_explain")
                noise = out.get("other_cpu_cores", 0.0)
                if noise <= args.noisy_cores or attempt == args.noisy_retries:
                    break
                log(
                    f"  {name}: other programs used {noise:.2f} cores during the drain: "
                    "discarding this measurement and repeating it"
                )
                discarded.append(out)
            if discarded:
                out["discarded_noisy"] = discarded
            entry["systems"][name] = out
    profile_summary = None
    if args.profile:
        log(f"profile: py-spy on a pgworker drain of {args.profile_n:,} jobs")
        try:
            profile_summary = await profile(res, args)
        except BenchError as exc:
            log(f"  profile FAILED: {exc}")
            failures.append(f"profile: {exc}")
    report = {
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "config": {
            "n": args.n,
            "runs": args.runs,
            "chunk": args.chunk,
            "concurrency": CONCURRENCY,
            "rate": args.rate,
            "latency_count": args.latency_count,
            "growth_rows": args.growth_rows,
            "systems": args.systems,
            "workloads": sorted(args.workloads),
            "base_rev": git_rev(args.base_src) if args.base_src else None,
            "pgqueuer_note": " ".join(s.note for s in SYSTEMS.values() if s.note),
        },
        "versions": vers,
        "runs": runs,
        "medians": medians(runs),
        "explain": explain,
        "fleet_explain": fleet_explain,
        "profile": profile_summary,
        "failures": failures,
    }
    text = render(report) + footnotes(runs)
    rev_at_end = git_rev()
    if rev_at_end != rev_at_start and not SYSTEMS["pgworker"].src:
        text += (
            f"\nNote: the repository moved from {rev_at_start} to {rev_at_end} during the run; "
            "workers started later ran the newer pgworker code.\n"
        )
    if failures:
        text += "\nFailures:\n" + "\n".join(f"- {f}" for f in failures) + "\n"
    print(text)
    (args.results / "latest.md").write_text(text)
    raw = json.dumps(report, indent=2, default=str)
    (args.results / "latest.json").write_text(raw)
    (args.results / f"run-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(raw)
    log(f"wrote {args.results / 'latest.md'} and latest.json")
    return 1 if failures else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", default=env.get("BENCH_DSN", DEFAULT_DSN), help="server (URL form)")
    p.add_argument("--n", type=int, default=int(env.get("BENCH_N", 20000)), help="jobs per drain")
    p.add_argument("--runs", type=int, default=int(env.get("BENCH_RUNS", 3)))
    p.add_argument(
        "--systems",
        default=env.get("BENCH_SYSTEMS", ",".join(LIB_SYSTEMS)),
        help="comma-separated, of: " + ",".join((*LIB_SYSTEMS, *OPTIONAL)),
    )
    p.add_argument(
        "--workloads",
        default=env.get("BENCH_WORKLOADS", ",".join(DEFAULT_WORKLOADS)),
        help="comma-separated, of: w1 (throughput), w2 (wake-up latency), w3 (floor), "
        "w4 (pgworker on a grown table), w5 (pgworker and pgworker-pooler with the fleet's "
        "features in the table)",
    )
    p.add_argument(
        "--base-src",
        type=Path,
        default=env.get("BENCH_BASE_SRC") or None,
        help="a checkout of pgworker (e.g. a git worktree of an older commit) measured as the "
        f"system {BASE}, beside this one (W1, W2)",
    )
    p.add_argument(
        "--src",
        type=Path,
        default=env.get("BENCH_SRC") or None,
        help="measure the systems pgworker and pgworker-durable from this checkout instead of "
        "this repository (W1, W2)",
    )
    p.add_argument("--chunk", type=int, default=5000, help="jobs per batch-enqueue call")
    p.add_argument("--rate", type=float, default=50.0, help="W2 enqueue rate, jobs/s")
    p.add_argument("--latency-count", type=int, default=500, help="W2 jobs")
    p.add_argument("--growth-rows", type=int, default=1_000_000, help="W4 finished jobs")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=float(env.get("BENCH_QUIET_WAIT", 180)),
        help="before each measurement, wait up to this many seconds for other programs to "
        "leave the cores idle (0: never wait)",
    )
    p.add_argument("--quiet-cores", type=float, default=0.3, help="what counts as idle")
    p.add_argument(
        "--noisy-retries",
        type=int,
        default=2,
        help="repeat a system's measurement (at most this many times) when other programs "
        "used more than --noisy-cores during its drain",
    )
    p.add_argument("--noisy-cores", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one drain may take")
    p.add_argument(
        "--profile",
        action="store_true",
        default=env.get("BENCH_PROFILE") == "1",
        help="also py-spy one pgworker drain",
    )
    p.add_argument("--profile-n", type=int, default=None, help="jobs in the profiled drain (--n)")
    p.add_argument("--profile-seconds", type=int, default=10)
    p.add_argument("--results", type=Path, default=HERE / "results")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the databases (debug)")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.workloads = {w.strip().lower() for w in args.workloads.split(",") if w.strip()}
    for s in args.systems:
        if s not in LIB_SYSTEMS and s not in OPTIONAL and s != BASE:
            known = ", ".join((*LIB_SYSTEMS, *OPTIONAL, BASE))
            p.error(f"unknown system {s!r}; choose from {known}")
    if (BASE in args.systems) != bool(args.base_src):
        p.error(f"the system {BASE} and --base-src (BENCH_BASE_SRC) go together")
    for name, src in (
        (BASE, args.base_src),
        ("pgworker", args.src),
        ("pgworker-durable", args.src),
    ):
        if src:
            src = src.resolve()
            if not (src / "pgworker" / "__init__.py").is_file():
                p.error(f"{src} holds no pgworker package")
            SYSTEMS[name].src = src
    args.base_src = SYSTEMS[BASE].src
    for w in args.workloads:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    if args.profile_n is None:
        args.profile_n = args.n
    if args.n <= 0 or args.runs <= 0 or args.chunk <= 0:
        p.error("--n, --runs and --chunk must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    res = Resources(admin_dsn=args.dsn, keep_dbs=args.keep_dbs)
    try:
        return asyncio.run(amain(args, res))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: cleaning up")
        return 130
    finally:
        res.cleanup()


if __name__ == "__main__":
    sys.exit(main())
