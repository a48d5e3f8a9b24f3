"""The command line: the only place that parses arguments, runs the event loop and installs
signal handlers. A user's mistake is one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import anyio

from . import __version__, cancel, db
from .enqueue import enqueue
from .errors import PgWorkerError
from .logs import configure, get_logger
from .registry import load
from .settings import Settings, dsn_from_env
from .worker import Worker

LIVE_WITHIN = 60.0


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", help="PostgreSQL DSN (default: $PGWORKER_DSN, else $DATABASE_URL)")
    common.add_argument("--schema", default=None, help="pgworker's schema (default: pgworker)")

    p = argparse.ArgumentParser(prog="pgworker", description="Background jobs on PostgreSQL.")
    p.add_argument("--version", action="version", version=f"pgworker {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")

    run = sub.add_parser("run", parents=[common], help="serve the handlers of a module")
    run.add_argument("target", metavar="MODULE[:ATTR]", help="module holding a pgworker.Registry")
    run.add_argument("--concurrency", type=int, help="jobs run at once (default 10)")
    run.add_argument(
        "--queue",
        dest="queues",
        action="append",
        help="queue to serve; repeat for several (default: default)",
    )
    run.add_argument("--worker-id", help="name of this worker (default: host-pid-random)")
    run.add_argument("--poll-interval", type=float, help="seconds between polls (default 1)")
    run.add_argument(
        "--shutdown-timeout",
        type=float,
        help="seconds running jobs get to finish on SIGTERM (default 30)",
    )
    run.add_argument("--lease", type=float, help="seconds a claimed job is held (default 30)")
    run.add_argument(
        "--no-listen",
        dest="listen",
        action="store_const",
        const=False,
        help="poll only (behind a transaction-pooling proxy)",
    )
    run.add_argument(
        "--durable-claims",
        action="store_const",
        const=True,
        help="claims wait for their WAL flush (see the README, Fast claims)",
    )
    run.add_argument("--log-format", choices=["json", "console"], default="console")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")

    enq = sub.add_parser("enqueue", parents=[common], help="enqueue one job")
    enq.add_argument("type", metavar="TYPE")
    enq.add_argument("--payload", default="{}", help="JSON payload (default {})")
    enq.add_argument("--queue")
    enq.add_argument("--priority", help="an int or low|medium|high|critical")
    enq.add_argument("--max-retries", type=int)
    enq.add_argument("--idempotency-key")
    enq.add_argument("--correlation-id")
    enq.add_argument("--delay", type=float, help="seconds from now")
    enq.add_argument("--run-at", help="ISO 8601 time with a timezone")

    can = sub.add_parser("cancel", parents=[common], help="cancel a job")
    can.add_argument("job_id", metavar="ID", type=int)

    st = sub.add_parser("status", parents=[common], help="counts per queue and status")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or dsn_from_env()
    if not dsn:
        raise PgWorkerError("no database given; pass --dsn or set PGWORKER_DSN or DATABASE_URL")
    return dsn


def _schema(args: argparse.Namespace) -> str:
    return args.schema or os.environ.get("PGWORKER_SCHEMA") or "pgworker"


async def _migrate(args: argparse.Namespace) -> int:
    conn = await db.connect(_dsn(args))
    try:
        applied = await db.migrate(conn, _schema(args))
    finally:
        await conn.close()
    print(f"applied migrations {applied}" if applied else "schema is up to date")
    return 0


async def _run(args: argparse.Namespace) -> int:
    configure(args.log_format, args.log_level)
    registry = load(args.target)
    settings = Settings.from_env(
        dsn=_dsn(args),
        concurrency=args.concurrency,
        queues=tuple(args.queues) if args.queues else None,
        worker_id=args.worker_id,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        lease=args.lease,
        listen=args.listen,
        durable_claims=args.durable_claims,
        schema=args.schema,
    )
    worker = Worker(registry, settings=settings)
    log = get_logger(worker_id=settings.worker_id)

    async def on_signals() -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            seen = 0
            async for signum in received:
                seen += 1
                name = signal.Signals(signum).name
                if seen == 1:
                    log.info(f"{name} received: stopping", grace_s=settings.shutdown_timeout)
                    worker.stop()
                else:
                    log.warning(f"{name} received again: handing back running jobs now")
                    worker.interrupt()

    async with anyio.create_task_group() as tg:
        tg.start_soon(on_signals)
        await worker.run()
        tg.cancel_scope.cancel()
    return 0


def _parse_priority(raw: str | None) -> int | str | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


async def _enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise PgWorkerError(f"--payload is not valid JSON: {exc}") from exc
    run_at = None
    if args.run_at:
        try:
            run_at = datetime.fromisoformat(args.run_at)
        except ValueError as exc:
            raise PgWorkerError(f"--run-at {args.run_at!r} is not an ISO 8601 time") from exc
    conn = await db.connect(_dsn(args))
    try:
        result = await enqueue(
            conn,
            args.type,
            payload,
            queue=args.queue,
            priority=_parse_priority(args.priority),
            max_retries=args.max_retries,
            idempotency_key=args.idempotency_key,
            correlation_id=args.correlation_id,
            run_at=run_at,
            delay=args.delay,
            schema=_schema(args),
        )
    finally:
        await conn.close()
    job = result.job
    print(
        json.dumps(
            {
                "id": job.id,
                "type": job.type,
                "queue": job.queue,
                "status": job.status.value,
                "created": result.created,
                "correlation_id": job.correlation_id,
            }
        )
    )
    return 0


async def _cancel(args: argparse.Namespace) -> int:
    conn = await db.connect(_dsn(args))
    try:
        outcome = await cancel(conn, args.job_id, schema=_schema(args))
    finally:
        await conn.close()
    messages = {
        "cancelled": f"job {args.job_id} cancelled (it was pending)",
        "cancelling": f"job {args.job_id} is running: its worker was asked to stop it",
    }
    print(messages.get(outcome, f"job {args.job_id} is {outcome}: nothing to cancel"))
    return 0


STATUSES = ("pending", "running", "completed", "failed", "cancelled")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


async def _status(args: argparse.Namespace) -> int:
    conn = await db.connect(_dsn(args))
    try:
        await db.check_schema(conn, _schema(args))
        found = await db.status(conn, _schema(args), LIVE_WITHIN)
    finally:
        await conn.close()
    queues: dict[str, dict[str, Any]] = {}
    for r in found["counts"]:
        queues.setdefault(r["queue"], dict.fromkeys(STATUSES, 0))[r["status"]] = r["jobs"]
    oldest = {r["queue"]: r["age"] for r in found["oldest_pending"]}
    workers = [dict(w) for w in found["workers"]]
    unserved = [{"queue": r["queue"], "type": r["type"]} for r in found["unserved"]]
    if args.json:
        print(
            json.dumps(
                {
                    "queues": {
                        q: {**c, "oldest_pending_age_s": oldest.get(q)} for q, c in queues.items()
                    },
                    "workers": [
                        {"worker_id": w["worker_id"], "queues": w["queues"], "types": w["types"]}
                        for w in workers
                    ],
                    "unserved": unserved,
                },
                indent=2,
            )
        )
        return 0
    header = ("queue", *STATUSES, "oldest pending")
    rows = [header] + [
        (q, *(str(c[s]) for s in STATUSES), _age(oldest.get(q))) for q, c in sorted(queues.items())
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    if not queues:
        print("(no jobs)")
    print(f"\nlive workers: {len(workers)}")
    for w in workers:
        print(f"  {w['worker_id']}  queues={','.join(w['queues'])}  types={','.join(w['types'])}")
    if unserved:
        print("\npending types that no live worker serves:")
        for u in unserved:
            print(f"  {u['queue']}: {u['type']}")
    return 0


COMMANDS = {
    "migrate": _migrate,
    "run": _run,
    "enqueue": _enqueue,
    "cancel": _cancel,
    "status": _status,
}


def _user_error(exc: BaseException) -> PgWorkerError | None:
    """The PgWorkerError behind `exc`, looking through task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc if isinstance(exc, PgWorkerError) else None


def _has_uvloop() -> bool:
    """uvloop (a dependency on POSIX) makes the event loop's socket work several times cheaper."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def _stopped_while_starting(signum: int, _frame: object) -> None:
    """SIGTERM before the worker serves: nothing is claimed yet, so stopping is clean."""
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        signal.signal(signal.SIGTERM, _stopped_while_starting)
    try:
        return anyio.run(
            COMMANDS[args.command], args, backend_options={"use_uvloop": _has_uvloop()}
        )
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = _user_error(exc)
        if error is None:
            raise
        print(f"pgworker {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
