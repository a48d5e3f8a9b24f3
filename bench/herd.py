"""The thundering herd, measured: how many claims a fleet of idle pgworker workers makes per job
enqueued, and per second with nothing to do (issue 22, item 3).

    bench/.venv/bin/python -m bench.herd                 # this checkout's workers
    bench/.venv/bin/python -m bench.herd --src /tmp/old  # another checkout's

Starts `--workers` `pgworker run bench.apps.pgworker_app --concurrency 10` processes (from
`--src`, as bench/run.sh runs a checkout: its directory as the only PYTHONPATH entry) against a
fresh database, then measures, in order:
- idle: `--idle-seconds` with no job;
- trickle: one job every `--every` seconds for `--seconds`, each enqueued by its own statement
  (`SELECT pgworker.enqueue('noop')`, which every schema version since 9 has), until all ran;
  `--type noop-capped` enqueues jobs of a task with `max_running=5` instead (issue 23), whose
  claims (job_claim_limited.sql) are counted too.

Claims are counted outside the workers: their connections go through a small proxy of this
script's own, which reads the extended-protocol messages the client sends (Parse, Bind) and
counts each Bind of the statement whose text holds the first line of the checkout's
`sql/queries/job_claim.sql`. Wake-up times (the attempt's start minus the job's creation, both
the database's clock) include the proxy's hop. Every job must have run exactly once."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import asyncpg

REPO = Path(__file__).resolve().parent.parent

APPS = {"noop": "bench.apps.pgworker_app", "noop-capped": "bench.apps.pgworker_capped_app"}
"""The app the workers run, by the job type enqueued."""

_SSL_REQUEST, _GSS_REQUEST, _CANCEL_REQUEST = 80877103, 80877104, 80877102


class ClaimCounter:
    """A TCP proxy to PostgreSQL that counts the executions of one statement."""

    def __init__(self, upstream: tuple[str, int], signatures: list[str]) -> None:
        self._upstream = upstream
        self._signatures = signatures
        self.claims = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        down = asyncio.create_task(_pipe(up_reader, writer))
        try:
            await self._client(reader, writer, up_writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await down
            writer.close()

    async def _client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up: asyncio.StreamWriter,
    ) -> None:
        while True:  # the startup packets: no type byte
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            rest = await reader.readexactly(length - 8)
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                writer.write(b"N")  # plain text: the proxy reads what the client sends
                await writer.drain()
                continue
            up.write(head + rest)
            await up.drain()
            if code == _CANCEL_REQUEST:
                return
            break
        claims: dict[bytes, bool] = {}
        while True:
            head = await reader.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await reader.readexactly(length - 4)
            if kind == b"P":
                name, _, rest = body.partition(b"\0")
                query = rest.partition(b"\0")[0].decode(errors="replace")
                claims[name] = any(s in query for s in self._signatures)
            elif kind == b"B":
                statement = body.split(b"\0", 2)[1]
                if claims.get(statement):
                    self.claims += 1
            up.write(head + body)
            await up.drain()
            if kind == b"X":
                return


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()


def _with_db(dsn: str, db: str, port: int | None = None) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    netloc = parts.netloc
    if port is not None:
        netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, f"/{db}", parts.query, ""))


def _percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def _wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dsn",
        default=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--src", type=Path, default=REPO, help="the pgworker checkout the workers run")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--every", type=float, default=0.025, help="seconds between enqueues")
    p.add_argument("--seconds", type=float, default=10.0, help="how long the trickle lasts")
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--settle", type=float, default=3.0, help="seconds between ready and measuring")
    p.add_argument(
        "--type",
        default="noop",
        choices=sorted(APPS),
        help="the job type enqueued: noop, or noop-capped (a task with max_running=5)",
    )
    a = p.parse_args()
    src = a.src.resolve()
    signatures = [
        next(line.strip() for line in path.read_text().splitlines() if line.strip())
        for path in (
            src / "sql" / "queries" / "job_claim.sql",
            src / "sql" / "queries" / "job_claim_limited.sql",
        )
        if path.exists()
    ]
    rev = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    db = f"bench_herd_{os.getpid()}"
    admin = await asyncpg.connect(a.dsn)
    await admin.execute(f'CREATE DATABASE "{db}"')
    env = {**os.environ, "PYTHONPATH": str(src)}
    procs: list[subprocess.Popen[bytes]] = []
    counter = None
    conn = None
    try:
        dsn = _with_db(a.dsn, db)
        subprocess.run(
            [sys.executable, "-m", "pgworker", "migrate", "--dsn", dsn],
            cwd=src,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        from urllib.parse import urlsplit

        parts = urlsplit(a.dsn)
        counter = ClaimCounter((parts.hostname or "127.0.0.1", parts.port or 5432), signatures)
        port = await counter.start()
        proxied = _with_db(a.dsn, db, port)
        for _ in range(a.workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "pgworker",
                        "run",
                        APPS[a.type],
                        "--concurrency",
                        str(a.concurrency),
                        "--log-level",
                        "warning",
                        "--dsn",
                        proxied,
                    ],
                    cwd=src,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        conn = await asyncpg.connect(dsn)
        listening = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = $1 AND application_name LIKE 'pgworker-listen:%'"
        )

        async def ready() -> bool:
            if any(proc.poll() is not None for proc in procs):
                raise RuntimeError("a worker exited")
            workers = await conn.fetchval("SELECT count(*) FROM pgworker.workers")
            return workers == a.workers and await conn.fetchval(listening, db) == a.workers

        await _wait("the workers", ready, 120)
        await asyncio.sleep(a.settle)

        c0 = counter.claims
        await asyncio.sleep(a.idle_seconds)
        idle = (counter.claims - c0) / a.idle_seconds

        n = int(a.seconds / a.every)
        c0 = counter.claims
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i * a.every - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await conn.execute("SELECT pgworker.enqueue($1)", a.type)

        async def all_done() -> bool:
            done = await conn.fetchval(
                "SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'"
            )
            return bool(done == n)

        await _wait("the jobs", all_done, 60)
        claims = counter.claims - c0
        rows = await conn.fetch(
            "SELECT j.id, count(a.*) AS attempts, "
            "extract(epoch FROM min(a.started_at) - j.created_at)::float8 AS wait "
            "FROM pgworker.jobs j JOIN pgworker.job_attempts a ON a.job_id = j.id GROUP BY j.id"
        )
        once = sum(1 for r in rows if r["attempts"] == 1)
        waits = [r["wait"] * 1000 for r in rows]
        out = {
            "src": str(src),
            "rev": rev,
            "workers": a.workers,
            "type": a.type,
            "idle_claims_per_s": round(idle, 2),
            "jobs": n,
            "claims": claims,
            "claims_per_job": round(claims / n, 2),
            "start_p50_ms": round(_percentile(waits, 50), 1),
            "start_p95_ms": round(_percentile(waits, 95), 1),
            "start_max_ms": round(max(waits), 1),
            "ran_once": once,
        }
        print(
            f"{a.workers} workers ({src.name} {rev}): idle {idle:.2f} claims/s in all; "
            f"{n} {a.type} jobs, one every {a.every * 1000:.0f} ms: {claims} claims, "
            f"{claims / n:.2f} per job; start p50 {out['start_p50_ms']} ms, "
            f"p95 {out['start_p95_ms']} ms, max {out['start_max_ms']} ms; "
            f"{once}/{n} ran exactly once"
        )
        print(json.dumps(out))
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if conn is not None:
            await conn.close()
        if counter is not None:
            await counter.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    asyncio.run(main())
