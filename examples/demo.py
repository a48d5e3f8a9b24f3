"""`make run`: the example application end to end.

Migrates, enqueues a handful of jobs, runs a real `pgworker run` worker until they are done, stops
it with SIGTERM and prints what `job_attempts` recorded. Then checks each job's final state and
the worker's exit status against what the README promises, and exits 1 when one differs. Uses
PGWORKER_DSN when set; otherwise an embedded PostgreSQL kept in `.pgdata/` (started for the run,
stopped after it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg

import pgworker
from pgworker import JobSpec

ROOT = Path(__file__).resolve().parent.parent


async def demo(dsn: str) -> list[str]:
    """Run the demo; returns what ended otherwise than promised (nothing when all is well)."""
    conn = await asyncpg.connect(dsn)
    try:
        applied = await pgworker.migrate(conn)
        print(f"migrations applied: {applied or 'none (up to date)'}")
        run = f"demo-{uuid.uuid4().hex[:8]}"
        async with conn.transaction():
            results = await pgworker.enqueue_many(
                conn,
                [
                    JobSpec("send-invoice", {"invoice_id": 41}, correlation_id=run),
                    JobSpec("resize-image", {"path": "cat.png"}, correlation_id=run),
                    JobSpec("sync-crm", {"customer_id": 7}, correlation_id=run),
                    JobSpec(
                        "charge-card",
                        {"card": "4000-0000-0000-0002"},
                        correlation_id=run,
                        max_retries=0,
                    ),
                ],
            )
            invoice, resize, crm, card = (r.job.id for r in results)
            first = await pgworker.enqueue(
                conn,
                "send-invoice",
                {"invoice_id": 42},
                idempotency_key=f"{run}-invoice-42",
                correlation_id=run,
            )
            again = await pgworker.enqueue(
                conn,
                "send-invoice",
                {"invoice_id": 42},
                idempotency_key=f"{run}-invoice-42",
                correlation_id=run,
            )
        print(
            f"enqueued {len(results) + 1} jobs; duplicate idempotency key -> "
            f"created={again.created}, same job: {again.job.id == first.job.id}"
        )

        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgworker",
                "run",
                "examples.app.handlers",
                "--dsn",
                dsn,
                "--concurrency",
                "4",
                "--log-format",
                "console",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            deadline = time.monotonic() + 60
            while await conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs WHERE correlation_id = $1"
                " AND status IN ('pending', 'running')",
                run,
            ):
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit("the demo's jobs did not finish; see the worker's log above")
                await asyncio.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                exit_status = worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                exit_status = None

        rows = await conn.fetch(
            """SELECT a.job_id, a.type, a.attempt, a.outcome,
                      coalesce(a.error_type || ': ' || a.error_message, '') AS error,
                      a.run_ms, a.wait_ms
               FROM pgworker.job_attempts a
               WHERE a.correlation_id = $1 ORDER BY a.job_id, a.attempt""",
            run,
        )
        print(f"\nattempts recorded in pgworker.job_attempts (correlation_id {run}):")
        # run_ms: the handler's run time, as the worker's log line and the dashboard say it;
        # wait_ms: how long the job waited past its run_at for the claim.
        header = ("job", "type", "attempt", "outcome", "run ms", "wait ms", "error")
        table = [
            header,
            *[
                (
                    str(r["job_id"]),
                    r["type"],
                    str(r["attempt"]),
                    r["outcome"],
                    "-" if r["run_ms"] is None else f"{r['run_ms']:.1f}",
                    "-" if r["wait_ms"] is None else f"{r['wait_ms']:.1f}",
                    r["error"],
                )
                for r in rows
            ],
        ]
        widths = [max(len(t[i]) for t in table) for i in range(len(header))]
        for t in table:
            print("  " + "  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip())
        totals = await conn.fetch(
            "SELECT status, count(*) AS n FROM pgworker.jobs WHERE correlation_id = $1"
            " GROUP BY status ORDER BY status",
            run,
        )
        print("\njobs by status: " + ", ".join(f"{r['status']}={r['n']}" for r in totals))

        # What the README says each job ends as: (status, retries counted, result, error, the
        # attempts' outcomes).
        expected = {
            invoice: ("completed", 0, {"sent": 41}, None, ["completed"]),
            resize: ("completed", 0, {"thumbnail": "cat.png.thumb.png"}, None, ["completed"]),
            crm: (
                "completed",
                2,
                {"synced": 7},
                None,  # completed: its failures are in job_attempts
                ["retried", "retried", "completed"],
            ),
            card: (
                "failed",
                0,
                None,
                "PermanentError: card 4000-0000-0000-0002 declined",
                ["failed"],
            ),
            first.job.id: ("completed", 0, {"sent": 42}, None, ["completed"]),
        }
        wrong = []
        if again.created or again.job.id != first.job.id:
            wrong.append(f"the duplicate idempotency key made a job: {again}")
        if exit_status != 0:
            wrong.append(f"the worker exited with status {exit_status} after SIGTERM, not 0")
        for job_id, want in expected.items():
            job = await pgworker.get_job(conn, job_id)
            found = await conn.fetch(
                "SELECT outcome FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt",
                job_id,
            )
            got = (
                job.status,
                job.retry_count,
                job.result,
                job.error,
                [r["outcome"] for r in found],
            )
            if got != want:
                wrong.append(f"job {job_id} ({job.type}) ended as {got}, expected {want}")
        jobs = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE correlation_id = $1", run
        )
        if jobs != len(expected):
            wrong.append(f"{jobs} jobs in the database, expected {len(expected)}")
        return wrong
    finally:
        await conn.close()


def report(wrong: list[str]) -> None:
    if wrong:
        print("\nNOT AS PROMISED:", *wrong, sep="\n  ")
        raise SystemExit(1)
    print("\nevery job ended as expected, and the worker exited 0 after SIGTERM")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    dsn = os.environ.get("PGWORKER_DSN")
    if dsn:
        report(asyncio.run(demo(dsn)))
        return
    from devdb import Cluster  # examples/devdb.py, beside this file

    cluster = Cluster(ROOT / ".pgdata")
    print(f"PGWORKER_DSN is not set: using an embedded PostgreSQL in {cluster.data}")
    dsn = cluster.start()
    try:
        wrong = asyncio.run(demo(dsn))
    finally:
        cluster.stop()
    report(wrong)


if __name__ == "__main__":
    main()
