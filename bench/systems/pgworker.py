"""pgworker, as the benchmark drives it: through its public API (`pgworker.enqueue_many`,
`pgworker.enqueue`), its CLI (`pgworker migrate`, `pgworker run`) and plain SQL on its tables.
What only pgworker has is here too: the check of its attempt rows, the count of its claim and
outcome statements, W4's pre-filled table and the EXPLAIN of its claim."""

from __future__ import annotations

import asyncio
import atexit
import re
import socket
import sys
import time
from typing import Any

import asyncpg

from bench.measure import BIN, REPO, log, src_env
from bench.systems.base import CONCURRENCY, System

# The bulk enqueue of a pgworker checkout given by `src` (--src, --base-src), run by that
# checkout's code in a process of its own; prints the seconds the enqueue calls took.
_ENQUEUE_IN_SRC = """
import asyncio, sys, time
import asyncpg, pgworker

async def main(dsn, n, chunk):
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        for i in range(0, n, chunk):
            specs = [pgworker.JobSpec("noop", {}) for _ in range(min(chunk, n - i))]
            await pgworker.enqueue_many(conn, specs)
        print(time.perf_counter() - t0)
    finally:
        await conn.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""

CHECK_SQL = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE j.status = 'completed' AND a.n = 1 AND a.completed = 1) AS ok,
       coalesce(sum(a.n), 0)::bigint AS attempts
FROM pgworker.jobs AS j
LEFT JOIN (SELECT job_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'completed') AS completed
           FROM pgworker.job_attempts GROUP BY job_id) AS a ON a.job_id = j.id
WHERE j.id > $1
"""

# W4: finished jobs spread over the past week, one completed attempt row each.
PREFILL_JOBS = """
INSERT INTO pgworker.jobs (type, queue, payload, priority, status, retry_count, max_retries,
                           attempts, correlation_id, run_at, claimed_at, worker_id,
                           heartbeat_at, created_at, updated_at, finished_at)
SELECT 'noop', 'default', '{}', 0, 'completed', 0, 3, 1, md5(g::text), t, t, 'prefill',
       t, t, t + interval '5 ms', t + interval '5 ms'
FROM (SELECT g, now() - interval '7 days' + g * interval '500 ms' AS t
      FROM generate_series(1, $1::int) AS g) AS s
"""
PREFILL_ATTEMPTS = """
INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                   outcome, started_at, finished_at)
SELECT id, 1, type, queue, worker_id, correlation_id, 'completed', claimed_at, finished_at
FROM pgworker.jobs
"""

# W5: what a fleet's other work leaves in the table beside the bench worker's plain `noop` jobs,
# seeded in one transaction. None of these types is served by bench/apps/pgworker_app.py: they are
# the work of other workers of the fleet (and their limits are those workers' task options), so
# the drain of the N `noop` jobs measures the plain claim with all of it sitting in the table.
FLEET_UNSERVED = 100_000  # pending jobs of a type nobody here serves, queue `default`
FLEET_DEPENDANTS = 10_000  # `noop` jobs parked behind parents that never end (after=[...])
FLEET_PARENTS = 100  # their parents: pending jobs of an unserved type, 100 dependants each
FLEET_KEYS = 100  # concurrency keys of a `max_running_per_key=1` task
FLEET_PER_KEY = 100  # pending jobs per key, beside the one running that holds the key's limit
FLEET_CAPPED = 1_000  # pending jobs of a `max_running=5` task, beside the 5 running that hold it
FLEET_CAP = 5
FLEET_SQL = (
    # Pending jobs of a type nobody serves, older than the N plain jobs (first in the queue).
    """
INSERT INTO pgworker.jobs (type, queue, run_at, created_at, updated_at)
SELECT 'fleet_unserved', 'default', t, t, t
FROM (SELECT now() - interval '1 hour' + g * interval '10 ms' AS t
      FROM generate_series(1, {unserved}) AS g) AS s
""",
    # The parents of the dependants: pending jobs of a type nobody serves, so they never end.
    """
INSERT INTO pgworker.jobs (type, queue, has_dependants)
SELECT 'fleet_parent', 'default', true FROM generate_series(1, {parents})
""",
    # The dependants, as enqueue(..., after=[parent]) writes them (migration 0019): pending,
    # parked (run_at = 'infinity'), waiting for one parent; of the served type `noop`, so that
    # they lie in the very index range the plain claim reads (after its due jobs).
    """
INSERT INTO pgworker.jobs (type, queue, run_at, parents, parents_left, on_parent_failure)
SELECT 'noop', 'default', 'infinity', ARRAY[p.id], 1, 'cancel'
FROM (SELECT id FROM pgworker.jobs WHERE type = 'fleet_parent') AS p
CROSS JOIN generate_series(1, {per_parent})
""",
    """
INSERT INTO pgworker.job_dependencies (parent_id, child_id)
SELECT parents[1], id FROM pgworker.jobs WHERE parents IS NOT NULL
""",
    # A max_running_per_key=1 task: 100 keys, each with one job running (its limit reached, so
    # the key's pending jobs stay blocked) and 100 pending; the round-robin's cursor mid-way.
    """
INSERT INTO pgworker.jobs (type, queue, concurrency_key, status, attempts, max_retries,
                           claimed_at, worker_id, lease_expires_at, heartbeat_at,
                           budget_started_at)
SELECT 'fleet_keyed', 'default', 'key-' || lpad(k::text, 3, '0'), 'running', 1, 3,
       now() - interval '1 minute', 'fleet-other', now() + interval '1 day', now(),
       now() - interval '1 minute'
FROM generate_series(1, {keys}) AS k
""",
    """
INSERT INTO pgworker.jobs (type, queue, concurrency_key)
SELECT 'fleet_keyed', 'default', 'key-' || lpad(k::text, 3, '0')
FROM generate_series(1, {keys}) AS k CROSS JOIN generate_series(1, {per_key})
""",
    """
INSERT INTO pgworker.key_cursors (queue, type, last_key)
VALUES ('default', 'fleet_keyed', 'key-' || lpad(({keys} / 2)::text, 3, '0'))
""",
    # A max_running=5 task: 5 jobs running (its limit reached), 1,000 pending.
    """
INSERT INTO pgworker.jobs (type, queue, status, attempts, max_retries, claimed_at, worker_id,
                           lease_expires_at, heartbeat_at, budget_started_at)
SELECT 'fleet_capped', 'default', 'running', 1, 3, now() - interval '1 minute', 'fleet-other',
       now() + interval '1 day', now(), now() - interval '1 minute'
FROM generate_series(1, {cap})
""",
    """
INSERT INTO pgworker.jobs (type, queue) SELECT 'fleet_capped', 'default'
FROM generate_series(1, {capped})
""",
    # The running jobs' open attempt rows, as their claim wrote them.
    """
INSERT INTO pgworker.job_attempts (job_id, attempt, type, queue, worker_id, correlation_id,
                                   started_at)
SELECT id, 1, type, queue, worker_id, correlation_id, claimed_at
FROM pgworker.jobs WHERE status = 'running'
""",
)
# Whether W5's own N jobs are still pending or running: the seeded jobs never end.
FLEET_UNFINISHED_SQL = """
    SELECT EXISTS (SELECT FROM pgworker.jobs
                   WHERE status = 'pending' AND queue = 'default' AND type = 'noop'
                     AND version = 1 AND run_at <= now())
        OR EXISTS (SELECT FROM pgworker.jobs WHERE status = 'running' AND type = 'noop')
"""

SCAN = re.compile(
    r"(Seq Scan|Index Scan(?: Backward)?|Index Only Scan(?: Backward)?|Bitmap Index Scan|"
    r"Bitmap Heap Scan)(?: using (\S+))? on (\S+)"
)


def claim_scans(plan: list[str]) -> list[str]:
    """The scans of the claim's `next` CTE (the candidate search), as 'Index Scan using X'."""
    found, inside, indent = [], False, 0
    for line in plan:
        stripped = line.lstrip()
        depth = len(line) - len(stripped)
        if stripped.startswith("CTE "):
            inside = stripped.startswith("CTE next")
            indent = depth
            continue
        if inside and depth <= indent and stripped:
            inside = False
        if inside:
            m = SCAN.search(line)
            if m:
                kind, index, rel = m.groups()
                found.append(f"{kind}{' using ' + index if index else ''} on {rel}")
    return found


class PgWorker(System):
    name = "pgworker"
    unfinished_sql = """
        SELECT EXISTS (SELECT FROM pgworker.jobs WHERE status = 'pending')
            OR EXISTS (SELECT FROM pgworker.jobs WHERE status = 'running')
    """
    interval_sql = """
        SELECT extract(epoch FROM min(started_at))::float8,
               extract(epoch FROM max(finished_at))::float8
        FROM pgworker.job_attempts WHERE started_at >= to_timestamp($1)
    """
    done_sql = "SELECT count(*) FROM pgworker.jobs WHERE status = 'completed'"
    #: Whether a worker has finished a job: the profile attaches once it has.
    served_sql = "SELECT EXISTS (SELECT FROM pgworker.jobs WHERE status = 'completed')"

    def _cli(self) -> list[str]:
        # From a checkout of its own: `python -m pgworker` run there imports that checkout's.
        return [sys.executable, "-m", "pgworker"] if self.src else [str(BIN / "pgworker")]

    async def setup(self, dsn: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self._cli(),
            "migrate",
            "--dsn",
            dsn,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.src,
            env=src_env(self.src) if self.src else None,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        if proc.returncode != 0:
            raise RuntimeError(f"pgworker migrate failed: {out.decode()}")

    async def enqueue_bulk(self, dsn: str, n: int, chunk: int) -> float:
        if self.src:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _ENQUEUE_IN_SRC,
                dsn,
                str(n),
                str(chunk),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.src,
                env=src_env(self.src),
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 600)
            if proc.returncode != 0:
                raise RuntimeError(f"{self.name}: enqueue failed: {out.decode()}")
            return float(out.decode().split()[-1])
        import pgworker

        conn = await asyncpg.connect(dsn)
        try:
            t0 = time.perf_counter()
            for i in range(0, n, chunk):
                specs = [pgworker.JobSpec("noop", {}) for _ in range(min(chunk, n - i))]
                await pgworker.enqueue_many(conn, specs)
            return time.perf_counter() - t0
        finally:
            await conn.close()

    extra_args: tuple[str, ...] = ()

    def worker_argv(self, dsn: str) -> list[str]:
        return [
            *self._cli(),
            "run",
            "bench.apps.pgworker_app",
            "--concurrency",
            str(CONCURRENCY),
            "--log-level",
            "warning",
            "--dsn",
            dsn,
            *self.extra_args,
        ]

    async def enqueue_one(self, handle: Any, t: float) -> None:
        import pgworker

        await pgworker.enqueue(handle, "latency", {"t": t})

    async def check(self, dsn: str, n: int, after_id: int = 0) -> str:
        """Every job after `after_id` completed, with exactly one attempt row, completed."""
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(CHECK_SQL, after_id)
        finally:
            await conn.close()
        if row["jobs"] == n and row["ok"] == n and row["attempts"] == n:
            return f"ok: {n}/{n} jobs completed with exactly 1 completed attempt"
        return (
            f"FAIL: {row['ok']}/{n} jobs completed with exactly 1 completed attempt "
            f"(jobs {row['jobs']}, attempt rows {row['attempts']})"
        )

    async def drain_figures(self, dsn: str, n: int, after_id: int = 0) -> dict[str, Any]:
        """How many claim and outcome-write statements the drain took, which says how well it
        batches: each statement stamps its rows with one now(), so distinct timestamps count
        statements."""
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(
                "SELECT count(DISTINCT claimed_at) AS c, count(DISTINCT finished_at) AS f "
                "FROM pgworker.jobs WHERE id > $1",
                after_id,
            )
        finally:
            await conn.close()
        claims, finishes = row["c"], row["f"]
        log(
            f"  {self.name}: {claims} claims ({n / claims:.1f}"
            f" jobs each), {finishes} outcome writes "
            f"({n / finishes:.1f} jobs each)"
        )
        return {"claim_statements": claims, "finish_statements": finishes}

    async def prefill(self, dsn: str, rows: int) -> tuple[float, int, str]:
        """W4: fill the tables with `rows` finished jobs and analyse them; returns the seconds it
        took, the last prefilled id and the tables' size."""
        conn = await asyncpg.connect(dsn)
        try:
            t0 = time.perf_counter()
            await conn.execute(PREFILL_JOBS, rows)
            await conn.execute(PREFILL_ATTEMPTS)
            await conn.execute("VACUUM ANALYZE pgworker.jobs")
            await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
            prefill_s = time.perf_counter() - t0
            max_id = await conn.fetchval("SELECT max(id) FROM pgworker.jobs")
            size = await conn.fetchval(
                "SELECT pg_size_pretty(pg_total_relation_size('pgworker.jobs') "
                "+ pg_total_relation_size('pgworker.job_attempts'))"
            )
        finally:
            await conn.close()
        return prefill_s, max_id, size

    async def prefill_fleet(self, dsn: str) -> tuple[float, int, dict[str, int]]:
        """W5: seed what a fleet's other work leaves in the table (FLEET_SQL), in one transaction,
        then a queue limit on another queue through the public API, then VACUUM ANALYZE; returns
        the seconds it took, the last seeded id and the jobs by type and status."""
        import pgworker

        sizes = {
            "unserved": FLEET_UNSERVED,
            "parents": FLEET_PARENTS,
            "per_parent": FLEET_DEPENDANTS // FLEET_PARENTS,
            "keys": FLEET_KEYS,
            "per_key": FLEET_PER_KEY,
            "cap": FLEET_CAP,
            "capped": FLEET_CAPPED,
        }
        conn = await asyncpg.connect(dsn)
        try:
            t0 = time.perf_counter()
            async with conn.transaction():
                for statement in FLEET_SQL:
                    await conn.execute(statement.format(**sizes))
            # A queue of the fleet with a limit of its own (not `default`: a limit on the bench
            # worker's queue would send all its claims through the limited claim).
            await pgworker.limit_queue(
                conn, "fleet_limited", max_running=5, reason="bench W5", by="bench"
            )
            await conn.execute("VACUUM ANALYZE pgworker.jobs")
            await conn.execute("VACUUM ANALYZE pgworker.job_attempts")
            await conn.execute("VACUUM ANALYZE pgworker.job_dependencies")
            prefill_s = time.perf_counter() - t0
            max_id = await conn.fetchval("SELECT max(id) FROM pgworker.jobs")
            rows = await conn.fetch(
                "SELECT type || ' ' || status || CASE WHEN run_at = 'infinity' "
                "THEN ' parked' ELSE '' END AS k, count(*) AS n FROM pgworker.jobs "
                "GROUP BY 1 ORDER BY 1"
            )
        finally:
            await conn.close()
        return prefill_s, max_id, {r["k"]: r["n"] for r in rows}

    def claim_sql(self) -> str:
        """The claim statement a worker runs, from the checkout's SQL file
        (`sql/queries/job_claim.sql`) rather than pgworker's internal modules: its `{name}`
        fragments (`_name.sql`) and `{schema}` filled in as pgworker does, and the columns it
        returns (`{job_columns}`, a list pgworker builds in Python) as `j.*`, which leaves the
        plan of the candidate search as it is."""
        folder = (self.src or REPO) / "sql" / "queries"
        text = (folder / "job_claim.sql").read_text()
        for fragment in sorted(folder.glob("_*.sql")):
            text = text.replace("{" + fragment.stem[1:] + "}", fragment.read_text().strip())
        return text.replace("{job_columns}", "j.*").replace("{schema}", '"pgworker"')

    async def explain_claim(self, dsn: str) -> dict[str, Any]:
        """The claim's plans, run under EXPLAIN (ANALYZE, BUFFERS) and rolled back: the custom
        plan (planned with its values, as a worker through a pooler has each statement planned:
        bitmap scans off) and the generic plan (what a direct worker's connections use:
        force_generic_plan, bitmap and sequential scans off, no JIT)."""
        # queues, types, limit, worker id, lease, the types' max_retries, code version, commit mode,
        # then the (type, version) pairs served: since migration 11 the types and their versions;
        # before, the types served at version 1 and the other pairs as `type@version` (none);
        # then, in checkouts that have them, $11 (take limited jobs too: false, as a worker) and
        # $12 (the most jobs of each type: NULL, the limit).
        sql = self.claim_sql()
        pairs = "$10::integer[]" in sql
        count = max(int(m) for m in re.findall(r"\$(\d+)", sql))
        types = ["text[]", "text[]", "int", "text", "float8", "int[]", "text", "text", "text[]"]
        types.append("integer[]" if pairs else "text[]")
        types += ["boolean", "integer[]"][: max(count - 10, 0)]
        params = (
            "'{default}', '{noop,latency}', 10, 'bench-explain', 30, '{3,3}', NULL, 'off', "
            f"'{{noop,latency}}', '{{{'1,1' if pairs else ''}}}'"
            + {11: ", false", 12: ", false, NULL"}.get(count, "")
        )
        settings = {
            "auto": ("enable_bitmapscan = off",),
            "force_generic_plan": ("enable_bitmapscan = off", "enable_seqscan = off", "jit = off"),
        }
        conn = await asyncpg.connect(dsn)
        out: dict[str, Any] = {}
        try:
            await conn.execute(f"PREPARE bench_claim({', '.join(types)}) AS " + sql)
            for mode in ("auto", "force_generic_plan"):
                tr = conn.transaction()
                await tr.start()
                try:
                    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                    for setting in settings[mode]:  # as the worker's connections have them
                        await conn.execute(f"SET LOCAL {setting}")
                    rows = await conn.fetch(
                        f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE bench_claim({params})"
                    )
                finally:
                    await tr.rollback()  # the claim really ran: undo it
                plan = [r[0] for r in rows]
                name = "custom plan" if mode == "auto" else "generic plan"
                out[name] = {"plan": plan, "scans": claim_scans(plan)}
        finally:
            await conn.close()
        return out

    def extra_report(self, report: dict[str, Any]) -> list[str]:
        """W4's claim plans and W5's, when they ran."""
        lines = []
        sections = (
            ("explain", f"on {report['config']['growth_rows']:,} finished jobs (W4)"),
            ("fleet_explain", "with the fleet's features in the table (W5)"),
        )
        for key, title in sections:
            explain = report.get(key)
            if not explain:
                continue
            lines += ["", f"## pgworker's claim query {title}", ""]
            for name, e in explain.items():
                verdict = ", ".join(e["scans"]) or "no scan found"
                lines.append(f"- {name}: {verdict}")
            for name, e in explain.items():
                lines += ["", f"{name} (EXPLAIN (ANALYZE, BUFFERS), rolled back):", "", "```"]
                lines += e["plan"]
                lines.append("```")
        return lines


class PgWorkerDurable(PgWorker):
    """pgworker with `--durable-claims`: every claim waits for its WAL flush, as the peers' do."""

    name = "pgworker-durable"
    title = "pgworker --durable-claims"
    extra_args = ("--durable-claims",)


class PgWorkerPooler(PgWorker):
    """pgworker with `--pooler` through a PgBouncer in transaction mode that the benchmark starts
    (Debian's, tests/pgbouncer.py) on a free port of 127.0.0.1, `default_pool_size` 20, for the
    whole run. The schema and the bulk enqueue go directly to PostgreSQL; the worker goes through
    PgBouncer only, without --listen-dsn (a draining worker claims as slots free). PgBouncer's CPU
    is counted apart from the worker's and PostgreSQL's."""

    name = "pgworker-pooler"
    title = "pgworker --pooler (PgBouncer)"
    note = (
        "pgworker --pooler: through PgBouncer 1.18 in transaction mode (default_pool_size 20), "
        "no --listen-dsn; its PgBouncer CPU is in the JSON (`pooler_cpu_ms_per_1k`)."
    )
    extra_args = ("--pooler",)
    supports_latency = False  # without --listen-dsn, a wake-up waits for the next poll
    _bouncer: Any = None

    async def setup(self, dsn: str) -> None:
        if PgWorkerPooler._bouncer is None:
            from tests.pgbouncer import PgBouncer, available

            if not available():
                raise RuntimeError("pgworker-pooler needs PgBouncer: apt-get install pgbouncer")
            bouncer = PgBouncer(dsn, pool_size=20)
            bouncer.start()
            atexit.register(bouncer.close)
            PgWorkerPooler._bouncer = bouncer
        await super().setup(dsn)

    def worker_argv(self, dsn: str) -> list[str]:
        return super().worker_argv(self._bouncer.dsn(dsn))

    def side_pid(self) -> int | None:
        return None if self._bouncer is None else self._bouncer.pid


class PgWorkerMetrics(PgWorker):
    """pgworker with `--metrics-port`: the same worker, counting every job for Prometheus (on a
    free port of 127.0.0.1, never scraped during the drain). Beside `pgworker` in one run, the
    ratio of their rates is what metrics cost the hot path."""

    name = "pgworker-metrics"
    title = "pgworker --metrics-port"

    def worker_argv(self, dsn: str) -> list[str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return [*super().worker_argv(dsn), "--metrics-port", str(port)]


class PgWorkerBase(PgWorker):
    """pgworker from another checkout (--base-src: a git worktree of an older commit), beside
    this one in the same run: its own migrations, enqueue, worker and bench app."""

    name = "pgworker-base"

    def label(self, config: dict[str, Any]) -> str:
        return f"pgworker-base (git {config.get('base_rev', '?')})"
