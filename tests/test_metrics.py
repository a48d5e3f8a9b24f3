"""Prometheus metrics: a real `pgworker run --metrics-port` scraped over HTTP
after a run of known jobs; the settings and options; errors at start-up."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pgworker
from pgworker._runtime import metrics as _metrics
from pgworker._version import DISTRIBUTION

from .apps.metrics import HOSTILE
from .helpers import ROOT, attempts, fake_claim, spawn_worker, status_of, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        return str(response.read().decode())


def scrape(port: int) -> Samples:
    """Every sample of a scrape, keyed by its name and labels, through prometheus_client's own
    parser: a scrape it cannot parse fails the test."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(scrape_text(port))
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def reachable(port: int) -> Samples | None:
    try:
        return scrape(port)
    except OSError:
        return None


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its sockets matched against /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        assert worker.wait(timeout=30) == 0
    finally:
        worker.kill()


async def test_a_scrape_after_known_jobs_counts_them(dsn, conn, tmp_path):
    past = datetime.now(UTC) - timedelta(minutes=2)
    for _ in range(3):
        await pgworker.enqueue(conn, "ok", {})
    for type_ in ("flaky", "doomed", "snoozy", HOSTILE):
        await pgworker.enqueue(conn, type_, {})
    await pgworker.enqueue(conn, "ok", {}, delay=3600)  # pending, not due
    await pgworker.enqueue(conn, "ok", {}, queue="unserved", run_at=past)  # due, waiting
    lost = await pgworker.enqueue(conn, "ok", {}, queue="default")
    port = free_port()
    # The job of a worker that died: its lease expired, the leader's rescue finds it `lost`.
    await fake_claim(conn, lost.job.id)
    worker = spawn_worker(
        "tests.apps.metrics",
        dsn,
        tmp_path / "worker.log",
        "--concurrency",
        "4",
        "--lease",
        "2",
        "--shutdown-timeout",
        "1",
        "--metrics-port",
        str(port),
    )
    try:
        # Every job but the two waiting ones ends (the lost one is rescued, then runs again).
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 8 FROM pgworker.jobs WHERE status IN ('completed', 'failed')"
            ),
            timeout=30,
        )
        ended = {
            (r["type"], r["outcome"]): r["n"]
            for r in await conn.fetch(
                "SELECT type, outcome, count(*) AS n FROM pgworker.job_attempts "
                "WHERE outcome <> 'running' GROUP BY type, outcome"
            )
        }
        assert ended == {
            ("ok", "completed"): 4,
            ("ok", "lost"): 1,
            ("flaky", "retried"): 1,
            ("flaky", "completed"): 1,
            ("doomed", "failed"): 1,
            ("snoozy", "snoozed"): 1,
            ("snoozy", "completed"): 1,
            (HOSTILE, "completed"): 1,
        }

        def settled() -> Samples | None:
            found = reachable(port)
            wanted = {"completed": 7.0, "failed": 1.0}
            if found is None or any(
                value(found, "pgworker_queue_jobs", queue="default", status=status) != n
                for status, n in wanted.items()
            ):
                return None
            return found

        samples = await wait_for(settled, timeout=30)
        for (type_, outcome), n in ended.items():
            assert value(
                samples, "pgworker_jobs_total", queue="default", type=type_, outcome=outcome
            ) == float(n), (type_, outcome)
        counted = sum(v for (name, _), v in samples.items() if name == "pgworker_jobs_total")
        assert counted == sum(ended.values())
        outcomes = {
            dict(labels)["outcome"] for (name, labels) in samples if name == "pgworker_jobs_total"
        }
        assert outcomes == {
            "completed",
            "retried",
            "snoozed",
            "failed",
            "timed_out",
            "cancelled",
            "interrupted",
            "lost",
            "waiting",
        }
        # Each attempt this worker ran is one observation of its run time; each claim one of
        # its wait (the lost attempt ran elsewhere).
        ran = {
            t: sum(n for (tt, o), n in ended.items() if tt == t and o != "lost") for t, _ in ended
        }
        for type_, n in ran.items():
            for histogram in ("pgworker_job_run_seconds", "pgworker_job_wait_seconds"):
                count = value(samples, f"{histogram}_count", queue="default", type=type_)
                assert count == float(n), (histogram, type_)
                inf = value(samples, f"{histogram}_bucket", queue="default", type=type_, le="+Inf")
                assert inf == float(n)
        assert value(samples, "pgworker_claims_total") == float(sum(ran.values()))
        assert value(samples, "pgworker_slots") == 4.0
        assert value(samples, "pgworker_slots_busy") == 0.0
        assert value(samples, "pgworker_db_reconnects_total") == 0.0
        # The queue gauges, from the elected worker (the only one here): every status of every
        # queue, and the age of the oldest due pending job.
        assert value(samples, "pgworker_queue_jobs", queue="default", status="pending") == 1.0
        assert value(samples, "pgworker_queue_jobs", queue="default", status="running") == 0.0
        assert value(samples, "pgworker_queue_jobs", queue="unserved", status="pending") == 1.0
        assert value(samples, "pgworker_queue_oldest_pending_seconds", queue="default") == 0.0
        age = value(samples, "pgworker_queue_oldest_pending_seconds", queue="unserved")
        assert age is not None and 120 <= age < 600
        # Labels are queues, types and outcomes: never an id.
        names = {k for (_, labels) in samples for k, _ in labels}
        assert names <= {"queue", "type", "outcome", "status", "le"}

        # A running job is a busy slot.
        await pgworker.enqueue(conn, "slow", {"seconds": 60})
        await wait_for(
            lambda: (
                (found := reachable(port)) is not None
                and value(found, "pgworker_slots_busy") == 1.0
            ),
            timeout=15,
        )
    finally:
        await stop(worker)
    log = (tmp_path / "worker.log").read_text()
    assert "Traceback" not in log, log


async def test_metrics_off_opens_no_port_and_imports_no_prometheus_client(dsn, conn, tmp_path):
    job = await pgworker.enqueue(conn, "ok", {})
    worker = spawn_worker("tests.apps.metrics", dsn, tmp_path / "worker.log")
    try:
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job.job.id
            ),
            timeout=20,
        )
        assert listening_ports(worker.pid) == set()
    finally:
        await stop(worker)
    code = (
        "import sys, pgworker, tests.apps.metrics as app\n"
        "w = pgworker.Worker(app.registry, 'postgresql://nowhere/x')\n"
        "print(sorted(m for m in sys.modules\n"
        "             if 'prometheus' in m or m == 'pgworker._runtime.metrics'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stderr


async def test_metrics_on_listens_on_the_port_given(dsn, tmp_path):
    port = free_port()
    worker = spawn_worker(
        "tests.apps.metrics", dsn, tmp_path / "worker.log", "--metrics-port", str(port)
    )
    try:
        await wait_for(lambda: reachable(port), timeout=20)
        assert listening_ports(worker.pid) == {port}
        # Any other path answers too (prometheus_client's server); a hostile request gets an
        # HTTP error, and the worker goes on.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GARBAGE \x00\xff /metrics HTTP/9.9\r\n\r\n")
            s.recv(1024)
        assert reachable(port) is not None
    finally:
        await stop(worker)


async def test_a_port_in_use_is_a_one_line_start_up_error(dsn, conn, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pgworker",
                "run",
                "tests.apps.metrics",
                "--metrics-port",
                str(port),
                "--worker-id",
                "metrics-taken",
                "--dsn",
                dsn,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    assert out.returncode != 0
    assert "metrics_port" in out.stderr and "already in use" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # Nothing was registered or left connected.
    assert not await conn.fetchval(
        "SELECT count(*) FROM pgworker.workers WHERE worker_id = 'metrics-taken'"
    )


async def test_a_failed_start_closes_the_metrics_server(empty_dsn):
    """The schema is missing: the worker refuses to start, and its port is free again."""
    from .apps.metrics import registry

    port = free_port()
    with pytest.raises(pgworker.SchemaError):
        async with pgworker.Worker(registry, empty_dsn, metrics_port=port):
            pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises when the server still holds it


async def test_two_workers_in_one_process_serve_their_own_figures(dsn, conn):
    from .apps.metrics import registry

    ports = free_port(), free_port()
    for _ in range(4):
        await pgworker.enqueue(conn, "ok", {})
    async with (
        pgworker.Worker(registry, dsn, concurrency=2, metrics_port=ports[0], lease=2) as a,
        pgworker.Worker(registry, dsn, concurrency=3, metrics_port=ports[1], lease=2) as b,
    ):
        await wait_for(
            lambda: conn.fetchval(
                "SELECT count(*) = 4 FROM pgworker.jobs WHERE status = 'completed'"
            )
        )

        def both() -> tuple[Samples, Samples] | None:
            found = scrape(ports[0]), scrape(ports[1])
            leaders = [
                s
                for s in found
                if value(s, "pgworker_queue_jobs", queue="default", status="completed")
            ]
            return found if len(leaders) == 1 else None

        first, second = await wait_for(both, timeout=20)
        assert value(first, "pgworker_slots") == 2.0
        assert value(second, "pgworker_slots") == 3.0
        claims = [value(s, "pgworker_claims_total") or 0.0 for s in (first, second)]
        assert sum(claims) == 4.0
        # Only the elected worker shows the queue gauges.
        shown = [any(name == "pgworker_queue_jobs" for name, _ in s) for s in (first, second)]
        assert sorted(shown) == [False, True]
        leader = (a, b)[shown.index(True)]
        other_port = ports[shown.index(False)]
        # The leader stops: the other worker is elected and shows them.
        leader.stop()
        await wait_for(
            lambda: any(name == "pgworker_queue_jobs" for name, _ in scrape(other_port)),
            timeout=20,
        )


async def test_without_prometheus_client_metrics_are_a_config_error_naming_the_extra():
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None\n"
        "import pgworker, tests.apps.metrics as app\n"
        "try:\n"
        "    pgworker.Worker(app.registry, 'postgresql://nowhere/x', metrics_port=9999)\n"
        "except pgworker.ConfigError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    wanted = f"metrics_port: metrics need prometheus-client: pip install '{DISTRIBUTION}[metrics]'"
    assert out.stdout.strip() == wanted, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"metrics_port": 0}, "metrics_port"),
        ({"metrics_port": 65536}, "metrics_port"),
        ({"metrics_port": True}, "metrics_port"),
        ({"metrics_port": "9100"}, "metrics_port"),
        ({"metrics_port": 9100, "metrics_host": ""}, "metrics_host"),
        ({"metrics_port": 9100, "metrics_host": "a b"}, "metrics_host"),
        ({"metrics_port": 9100, "metrics_host": "h\x00"}, "metrics_host"),
    ],
)
async def test_bad_metrics_settings_name_the_field(options: dict[str, Any], field: str):
    with pytest.raises(pgworker.ConfigError) as raised:
        pgworker.Settings(dsn="postgresql://db/x", **options)
    assert str(raised.value).startswith(field), raised.value


async def test_metrics_settings_from_the_environment():
    env = {"PGWORKER_DSN": "postgresql://db/x"}
    assert pgworker.Settings.from_env(env).metrics_port is None
    assert pgworker.Settings.from_env(env).metrics_host == "127.0.0.1"
    s = pgworker.Settings.from_env(
        {**env, "PGWORKER_METRICS_PORT": "9100", "PGWORKER_METRICS_HOST": "0.0.0.0"}
    )
    assert (s.metrics_port, s.metrics_host) == (9100, "0.0.0.0")
    with pytest.raises(pgworker.ConfigError, match="PGWORKER_METRICS_PORT"):
        pgworker.Settings.from_env({**env, "PGWORKER_METRICS_PORT": "ninety"})


async def test_a_host_that_is_not_this_hosts_is_a_start_up_error_naming_it(dsn):
    from .apps.metrics import registry

    with pytest.raises(pgworker.ConfigError) as raised:
        async with pgworker.Worker(
            registry, dsn, metrics_port=free_port(), metrics_host="192.0.2.1"
        ):
            pass
    assert str(raised.value).startswith("metrics_host"), raised.value


async def test_the_exposition_of_hostile_label_values_parses():
    """Types come from the database: whatever they hold, the scrape stays valid."""
    settings = pgworker.Settings(dsn="postgresql://db/x", metrics_port=free_port())
    metrics = _metrics.Metrics(settings)
    odd = [HOSTILE, "\\", '"', "\n", "}", "a" * 200, "emoji 🎉", "tab\tand\rcr"]
    metrics.lost(("q " + t, t) for t in odd)
    metrics.start()
    try:
        samples = scrape(metrics.port or 0)
    finally:
        metrics.close()
    for t in odd:
        assert value(samples, "pgworker_jobs_total", queue="q " + t, type=t, outcome="lost") == 1.0


async def test_queue_gauges_are_cleared_when_leadership_is_lost(dsn, conn):
    from .apps.metrics import registry

    port = free_port()
    await pgworker.enqueue(conn, "ok", {}, delay=3600)

    def gauges() -> bool:
        return any(name == "pgworker_queue_jobs" for name, _ in scrape(port))

    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=1):
        await wait_for(gauges)
        # Another worker holds the leadership now (as after a pause longer than the lease).
        await conn.execute(
            "UPDATE pgworker.leader SET worker_id = 'elsewhere', "
            "expires_at = now() + interval '1 hour' WHERE name = 'maintenance'"
        )
        await wait_for(lambda: not gauges())
        assert value(scrape(port), "pgworker_slots") == 10.0


async def test_lost_connections_are_counted_as_reconnects(dsn, conn):
    from .apps.metrics import registry

    port = free_port()
    async with pgworker.Worker(registry, dsn, metrics_port=port, worker_id="metrics-cut") as w:
        await wait_for(
            lambda: value(scrape(port), "pgworker_db_reconnects_total") == 0.0, timeout=60
        )
        # The server ends every connection of the worker: the listener's and the pool's.
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE '%:metrics-cut'"
        )
        job = await pgworker.enqueue(conn, "ok", {})
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status = 'completed' FROM pgworker.jobs WHERE id = $1", job.job.id
            ),
            timeout=60,
        )
        # The listener's reconnection and at least one of the pool's (each after a backoff).
        await wait_for(
            lambda: (value(scrape(port), "pgworker_db_reconnects_total") or 0.0) >= 2.0,
            timeout=60,
        )
        # A service that met a second dead connection retries once more: wait, do not sample.
        await wait_for(lambda: w.health()["producer"]["state"] == "ok", timeout=60)


async def test_the_queue_gauges_show_at_most_so_many_queues(conn):
    from pgworker._db.queries import queries

    for queue in ("c", "a", "b"):
        await pgworker.enqueue(conn, "ok", {}, queue=queue)
    rows = await queries("pgworker").metrics_queues(conn, 2)
    assert [(r["queue"], r["status"], r["jobs"]) for r in rows] == [
        ("a", "pending", 1),
        ("b", "pending", 1),
    ]
    assert all(r["oldest_pending_seconds"] >= 0 for r in rows)
    assert _metrics.MAX_QUEUES == 1000


# --- endless queue names ---------------------------------------------------------------------


async def test_jobs_rescued_from_endless_queue_names_do_not_grow_the_metrics_without_bound():
    """The elected worker's rescue counted `lost` under each rescued job's (queue, type), of any
    queue and type: a client claiming over HTTP in a new queue name each time (then letting the
    lease run out) added a series of ~50 samples per name to every scrape, for ever."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from pgworker._runtime.metrics import Metrics
    from pgworker.settings import Settings

    bound = 1000  # _metrics.MAX_LOST_SERIES
    metrics = Metrics(Settings(dsn="postgresql://x@127.0.0.1/x", metrics_port=1))
    metrics.lost([("default", "served")])
    metrics.lost((f"q-{i}", "t") for i in range(5 * bound))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    families = text_string_to_metric_families(generate_latest(registry).decode())
    lost = {
        (s.labels["queue"], s.labels["type"]): s.value
        for f in families
        if f.name == "pgworker_jobs"
        for s in f.samples
        if s.name == "pgworker_jobs_total" and s.labels["outcome"] == "lost"
    }
    assert len(lost) <= bound + 1
    assert sum(lost.values()) == 5 * bound + 1
    assert lost[("default", "served")] == 1


# --- a cancelled attempt counted as its row says ---------------------------------------------


@pytest.mark.parametrize("ends", ["fails", "completes"])
async def test_metrics_count_a_cancelled_attempt_as_its_row_says(
    dsn: str, conn: Any, ends: str
) -> None:
    """The handler of a job an operator cancels fails before a heartbeat tells it: the database
    ends the job and its attempt `cancelled` (job_finish_many.sql), and pgworker_jobs_total said
    `retried`. A completion stays completed on both sides."""
    registry = pgworker.Registry()
    started, go = asyncio.Event(), asyncio.Event()

    @registry.task("slow", retry=pgworker.RetryPolicy(max_retries=3, initial_delay=60))
    async def slow(ctx: pgworker.JobContext, payload: dict[str, Any]) -> None:
        started.set()
        await go.wait()
        if ends == "fails":
            raise RuntimeError("failed after the cancel request")

    r = await pgworker.enqueue(conn, "slow", {})
    port = free_port()
    # A lease of 10 minutes and no LISTEN: neither a heartbeat nor a notification tells the
    # handler of the cancel before it ends.
    async with pgworker.Worker(registry, dsn, metrics_port=port, lease=600, listen=False):
        await asyncio.wait_for(started.wait(), 30)
        assert await pgworker.cancel(conn, r.job.id) == "cancelling"
        go.set()
        await wait_for(
            lambda: conn.fetchval(
                "SELECT status <> 'running' FROM pgworker.jobs WHERE id = $1", r.job.id
            ),
            timeout=30,
        )
        rows = [a["outcome"] for a in await attempts(conn, r.job.id)]
        wanted = {"fails": "cancelled", "completes": "completed"}[ends]
        assert rows == [wanted]
        assert await status_of(conn, r.job.id) == wanted

        def counted() -> dict[str, float] | None:
            found = {
                dict(labels)["outcome"]: v
                for (name, labels), v in scrape(port).items()
                if name == "pgworker_jobs_total" and v
            }
            return found or None

        assert await wait_for(counted, timeout=30) == {wanted: 1.0}
