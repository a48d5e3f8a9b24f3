"""Hostile users, fifth round: the surfaces of issues 14 and 15 (the HTTP API of `pgworker serve`,
the dashboard, metrics, the health file, pgworker.testing) attacked by clients, files and
handlers. Each test states what must hold, and failed before its fix."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import pgworker

from .helpers import cli, database_of, fake_claim, has_status, status_of, wait_for
from .webserver import serving

ROOT = Path(__file__).resolve().parent.parent


def health(path: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """`pgworker health --health-file PATH`, bounded: a probe that hangs fails the test."""
    return cli("health", "--health-file", str(path), timeout=timeout)


def fresh(**changes: object) -> str:
    content: dict[str, object] = {
        "written_at": datetime.now(UTC).isoformat(),
        "lease": 30,
        "worker_id": "w",
        "pid": 1,
        "stopping": False,
        "services": {"producer": {"state": "ok"}},
    }
    return json.dumps({**content, **changes})


# --- the health file --------------------------------------------------------------------------


def test_a_fifo_at_the_health_file_path_is_unhealthy_at_once_not_a_hung_probe(tmp_path):
    """open() of a FIFO blocks until a writer comes: the probe hung (till its own timeout)."""
    path = tmp_path / "health.json"
    os.mkfifo(path)
    out = health(path, timeout=10)
    assert out.returncode == 1
    assert "not a regular file" in out.stderr


def test_a_health_file_turned_into_an_endless_file_is_unhealthy_without_reading_it_all(tmp_path):
    """A symlink to /dev/zero (or a huge file): the probe read it all into memory, forever."""
    path = tmp_path / "health.json"
    path.symlink_to("/dev/zero")
    out = health(path, timeout=10)
    assert out.returncode == 1 and "not a regular file" in out.stderr
    big = tmp_path / "big.json"
    big.write_text(fresh()[:-1] + ', "x": "' + "a" * (2 * 1024 * 1024) + '"}')
    out = health(big)
    assert out.returncode == 1 and "over 1,048,576 bytes" in out.stderr


def test_a_symlink_to_a_fresh_file_is_still_judged_and_a_directory_is_unhealthy(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(fresh())
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert health(link).returncode == 0
    directory = tmp_path / "dir"
    directory.mkdir()
    out = health(directory)
    assert out.returncode == 1 and out.stderr.startswith("pgworker health: unhealthy: ")


@pytest.mark.parametrize(
    "content",
    [
        fresh(written_at="9999-12-31T00:00:00+00:00"),
        fresh(written_at=(datetime.now(UTC) + timedelta(days=1)).isoformat()),
        fresh(written_at="2000-01-01T00:00:00+00:00", lease=1e300),
    ],
    ids=["year-9999", "a-day-ahead", "lease-1e300"],
)
def test_a_garbage_health_file_that_never_goes_stale_is_unhealthy(tmp_path, content):
    """A written_at in the future counted as written 0 s ago, and a lease of 1e300 never ran
    out: a file replaced by such garbage said healthy forever, whatever the worker did."""
    path = tmp_path / "health.json"
    path.write_text(content)
    out = health(path)
    assert out.returncode == 1, out.stdout


def test_a_health_file_of_deep_json_or_lone_surrogates_is_judged_in_one_line(tmp_path):
    """json.loads raised RecursionError (not ValueError) on deep JSON, and a service name or
    state holding a lone surrogate ("\\ud800", valid JSON) could not be printed: both ended
    the probe with a traceback instead of its one line."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    out = health(deep)
    assert out.returncode == 1 and "unreadable JSON" in out.stderr
    assert "Traceback" not in out.stderr
    named = tmp_path / "named.json"
    named.write_text(fresh(services={"\ud800x": {"state": "ok"}}))
    out = health(named)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("pgworker health: ok: ") and "\\ud800x ok" in out.stdout
    state = tmp_path / "state.json"
    state.write_text(fresh(services={"a": {"state": "bad\ud800"}}))
    out = health(state)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr


# --- pgworker serve: the database gone under it -------------------------------------------------


def test_a_logged_traceback_never_shows_the_locals_of_its_frames():
    """The console log rendered tracebacks with rich, every frame's locals included: the bearer
    token of the request, the DSN's password, a payload were printed in plain text on stderr."""
    import io

    import structlog

    from pgworker import _logs

    out = io.StringIO()
    secret = "".join(reversed("lacol-a-ni-nekot-terces"))  # not in this file's source lines
    _logs.configure("console", "info", stream=out)
    try:

        def handle(authorization: str) -> None:
            raise RuntimeError("boom")

        try:
            handle(f"Bearer {secret}")
        except RuntimeError:
            structlog.get_logger("t").error("failed", exc_info=True)
    finally:
        _logs.configure("console", "info")
    text = out.getvalue()
    assert "RuntimeError: boom" in text and "in handle" in text
    assert secret not in text


@pytest.mark.asyncio(loop_scope="session")
async def test_serve_recovers_when_its_connections_are_killed_never_dropping_a_client(dsn, conn):
    """pg_terminate_backend of serve's connections while requests run: asyncpg's
    InternalClientError reached the Exception handler, whose answer Starlette re-raises; uvicorn
    logged a traceback (with the bearer token among its locals) and closed the client's
    connection, so the next request on it failed with a ReadError."""
    async with serving(dsn) as served:
        async with served.client(timeout=30) as client:
            seen: list[object] = []
            for _ in range(4):
                await asyncio.gather(*(client.get("/jobs") for _ in range(12)))
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'pgworker:serve%' AND datname = $1",
                    database_of(dsn),
                )
                for i in range(6):
                    answers = await asyncio.gather(
                        client.get("/jobs"),
                        client.post("/jobs", json={"type": "t", "payload": i}),
                        client.get("/queues"),
                        client.get("/workers"),
                        client.get("/jobs/1"),
                        return_exceptions=True,
                    )
                    seen += [getattr(a, "status_code", a) for a in answers]
            assert all(s in (200, 201, 404, 503) for s in seen), seen
            assert (await client.get("/jobs")).status_code == 200
        log = served.stderr()
    assert served.token not in log
    assert "Exception in ASGI application" not in log


@pytest.mark.asyncio(loop_scope="session")
async def test_clients_that_leave_mid_body_leave_no_traceback_in_the_log(dsn, capsys, caplog):
    """A POST whose client disconnects before the end of its body: the dashboard's form (the
    login, which needs no token) logged two error tracebacks each time, so anyone could fill
    serve's log with them. The application is called as uvicorn calls it, so that the test knows
    when the request has been dealt with (the call returns): uvicorn logs its traceback ("Exception
    in ASGI application") exactly when that call raises."""
    from pgworker._web.app import create_app
    from pgworker._web.config import WebConfig

    app = create_app(WebConfig(dsn=dsn, tokens=("token",)))
    for path, kind in [
        ("/ui/login", b"application/x-www-form-urlencoded"),
        ("/jobs", b"application/json"),
    ]:
        left, sent = await _leave_mid_body(app, path, kind)
        assert left == 1, "the application did not read the body"
        assert all(m.get("status", 400) < 500 for m in sent), sent
    logged = capsys.readouterr()
    assert "Traceback" not in logged.out + logged.err and "[error" not in logged.out + logged.err
    assert [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def _leave_mid_body(app: Any, path: str, kind: bytes) -> tuple[int, list[dict[str, Any]]]:
    """POST `path` to the application as uvicorn does, the client leaving after 8 of the 100
    bytes it announced; returns the messages left unread (the disconnect) and those sent. The
    call raising is what uvicorn logs a traceback for."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b"csrf=abc", "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if len(messages) > 1 else messages[0]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"authorization", b"Bearer token"),
            (b"content-type", kind),
            (b"content-length", b"100"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    await app(scope, receive, send)
    return len(messages), sent


# --- metrics -------------------------------------------------------------------------------------


def test_jobs_rescued_from_endless_queue_names_do_not_grow_the_metrics_without_bound():
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


# --- pgworker serve: pages ------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_a_page_of_large_jobs_is_cut_by_its_size_and_the_pages_still_list_every_job(
    dsn, conn
):
    """GET /jobs?limit=1000 read a thousand jobs whole, payloads and results of up to 64 MB each:
    one request could hold gigabytes in serve's memory. A page now ends at about 8 MB of JSON,
    with a next_before, and following the pages lists every job once."""
    big = "x" * (3 * 1024 * 1024)
    made = [(await pgworker.enqueue(conn, "big", {"blob": big, "n": i})).job.id for i in range(12)]
    small = [(await pgworker.enqueue(conn, "small", {"n": i})).job.id for i in range(5)]
    async with serving(dsn) as served, served.client(timeout=60) as client:
        first = await client.get("/jobs", params={"limit": 1000})
        assert first.status_code == 200
        assert len(first.content) < 16 * 1024 * 1024
        seen: list[int] = []
        page = first.json()
        while True:
            assert page["jobs"], page
            seen += [j["id"] for j in page["jobs"]]
            if page["next_before"] is None:
                break
            answer = await client.get(
                "/jobs", params={"limit": 1000, "before": page["next_before"]}
            )
            assert answer.status_code == 200 and len(answer.content) < 16 * 1024 * 1024
            page = answer.json()
        assert seen == sorted(made + small, reverse=True)
        only = await client.get("/jobs", params={"type": "small", "limit": 5})
        assert [j["id"] for j in only.json()["jobs"]] == small[::-1]


DEEP = "[" * 5000 + "]" * 5000
"""JSON that jsonb stores and Python cannot decode (past its recursion limit): what a row
written around pgworker's checks (plain SQL, another language) may hold."""


@pytest.mark.asyncio(loop_scope="session")
async def test_a_job_python_cannot_decode_hides_neither_a_page_nor_itself_nor_the_next_claim(
    dsn, conn
):
    """One such job made GET /jobs answer 409 for every page it was on (nobody could list the
    jobs), GET /jobs/{id} of a job with such a result or milestone 500, and every HTTP claim
    that took it 409 (the job left running till its lease ran out, then claimed again)."""
    insert = "INSERT INTO pgworker.jobs (type, payload) VALUES ($1, $2::jsonb) RETURNING id"
    good = await conn.fetchval(insert, "t", "{}")
    poison = await conn.fetchval(insert, "t", DEEP)
    done = await conn.fetchval(
        "INSERT INTO pgworker.jobs (type, payload, status, result, finished_at) "
        "VALUES ('u', '{}', 'completed', $1::jsonb, now()) RETURNING id",
        DEEP,
    )
    await conn.execute(
        "INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail) "
        "VALUES ($1, 1, 'm', $2::jsonb)",
        done,
        DEEP,
    )
    async with serving(dsn) as served, served.client(timeout=60) as client:
        listed = await client.get("/jobs")
        assert listed.status_code == 200, listed.text
        assert [j["id"] for j in listed.json()["jobs"]] == [done, poison, good]
        shown = (await client.get(f"/jobs/{poison}")).json()
        assert shown["payload"] is None and "RecursionError" in shown["unreadable"]["payload"]
        shown = await client.get(f"/jobs/{done}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["result"] is None and shown.json()["milestones"][0]["detail"] is None
        claims = []
        for _ in range(3):
            answer = await client.post("/jobs/claim", json={"worker_id": "w", "types": ["t"]})
            assert answer.status_code in (200, 204), answer.text
            claims.append(answer.json()["id"] if answer.status_code == 200 else None)
        assert claims == [good, None, None]
    row = await conn.fetchrow("SELECT status, error FROM pgworker.jobs WHERE id = $1", poison)
    assert row["status"] == "failed" and row["error"].startswith("InvalidPayload: ")


@pytest.mark.asyncio(loop_scope="session")
async def test_an_http_worker_can_fail_its_job_when_a_column_of_it_cannot_be_decoded(dsn, conn):
    """Its milestone written deep by SQL while it ran: `fail` decoded the whole row first and
    answered 409, so the worker could not end its attempt."""
    async with serving(dsn) as served, served.client(timeout=60) as client:
        await client.post("/jobs", json={"type": "t", "payload": {"a": 1}})
        claimed = (await client.post("/jobs/claim", json={"worker_id": "w"})).json()
        await conn.execute(
            "UPDATE pgworker.jobs SET progress = $2::jsonb WHERE id = $1", claimed["id"], DEEP
        )
        body = {
            "worker_id": "w",
            "attempt": claimed["attempt"],
            "error": "E: no",
            "permanent": True,
        }
        failed = await client.post(f"/jobs/{claimed['id']}/fail", json=body)
        assert failed.status_code == 200, failed.text
        assert failed.json()["status"] == "failed" and "progress" in failed.json()["unreadable"]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_read_only_server_writes_nothing_not_even_maintenance(dsn, conn):
    """`serve --read-only` ("reads only", says the README) still led maintenance: it took the
    leader row, rescued and pruned (deleted) jobs; on a database role that may only read, it
    logged a traceback of `permission denied` over and over."""
    role = f"pgw_reader_{uuid.uuid4().hex[:8]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await conn.execute(
            f"GRANT USAGE ON SCHEMA pgworker TO {role}; "
            f"GRANT SELECT ON ALL TABLES IN SCHEMA pgworker TO {role}"
        )
        expired = (await pgworker.enqueue(conn, "t", {})).job.id
        await fake_claim(conn, expired, worker_id="gone", lease_s=-60)
        reader = dsn.replace("postgres@", f"{role}@", 1)
        fast = {"PGWORKER_LEASE": "1"}  # maintenance, were it on, would tick every 0.5 s
        async with serving(reader, "--read-only", env=fast) as served, served.client() as client:
            assert (await client.get("/jobs")).status_code == 200
            # Maintenance starts with the server, before it answers, and tries to lead at once.
            # A witness started after that (a worker with maintenance, the same 1 s lease) leads
            # and rescues the expired job: by then the server's first tick, were there one, has
            # come and gone, and a read-only role's attempt to lead is `permission denied`.
            witness = pgworker.Registry()
            witness.task("elsewhere-only", queue="elsewhere")(_nothing)
            async with pgworker.Worker(witness, dsn, worker_id="witness", lease=1.0):
                await wait_for(lambda: has_status(conn, expired, "pending"), timeout=30)
                assert await conn.fetchval("SELECT worker_id FROM pgworker.leader") == "witness"
            assert (await client.get("/jobs")).status_code == 200
            log = served.stderr()
        assert "permission denied" not in log and "Traceback" not in log, log
    finally:
        await conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


async def _nothing(ctx: pgworker.JobContext, payload: Any) -> None:
    return None


# --- pgworker.testing ----------------------------------------------------------------------------


@pytest.mark.asyncio(loop_scope="session")
async def test_drain_and_run_job_refuse_a_lone_string_where_a_list_of_names_goes(conn):
    """drain(conn, registry, redact_keys="password") took the string as the keys "p", "a", "s",
    ...: the password the handler's error quoted was stored unredacted; queues="default" drained
    the queues "d", "e", "f", ... and left the default queue's jobs pending, silently."""
    from pgworker.testing import drain, run_job

    registry = pgworker.Registry()

    @registry.task("leaks", max_retries=0)
    async def leaks(ctx: pgworker.JobContext, payload: dict[str, str]) -> None:
        raise ValueError(f"login failed for {payload['password']}")

    job = (await pgworker.enqueue(conn, "leaks", {"password": "hunter2-secret"})).job.id
    with pytest.raises(pgworker.ValidationError, match="redact_keys") as refused:
        await drain(conn, registry, redact_keys="password")
    assert "['password']" in str(refused.value)
    with pytest.raises(pgworker.ValidationError, match="queues"):
        await drain(conn, registry, queues="default")
    with pytest.raises(pgworker.ValidationError, match="redact_keys"):
        await run_job(registry, "leaks", {"password": "x"}, redact_keys="password")
    assert await status_of(conn, job) == "pending"
    ran = await drain(conn, registry, redact_keys=["password"])
    assert ran.failed == [job] and "hunter2-secret" not in (ran.attempts[0].error or "")


@pytest.mark.asyncio(loop_scope="session")
async def test_the_enqueued_job_helpers_name_the_bad_argument(conn):
    """A NUL or a lone surrogate in `type`, a payload nested too deep or holding a lone
    surrogate: asyncpg's and PostgreSQL's own errors (CharacterNotInRepertoireError, DataError,
    InvalidTextRepresentationError, RecursionError), not a ValidationError naming the field."""
    from pgworker.testing import assert_enqueued, assert_not_enqueued, enqueued_jobs

    deep: list[Any] = []
    for _ in range(3000):
        deep = [deep]
    cases = [
        ("type", enqueued_jobs(conn, type="a\x00b")),
        ("type", enqueued_jobs(conn, type="\ud800")),
        ("queue", enqueued_jobs(conn, queue="q\x00")),
        ("correlation_id", enqueued_jobs(conn, correlation_id="\x00")),
        ("payload", assert_enqueued(conn, type="t", payload=deep)),
        ("payload", assert_not_enqueued(conn, type="t", payload={"\ud800": 1})),
        ("payload_contains", enqueued_jobs(conn, payload_contains={"k": "\x00"})),
    ]
    for field, call in cases:
        with pytest.raises(pgworker.ValidationError) as refused:
            await call
        assert refused.value.field == field


@pytest.mark.asyncio(loop_scope="session")
async def test_pgworker_show_of_a_milestone_python_cannot_decode_is_one_line(dsn, conn):
    """A milestone's detail nested too deep (written by SQL): `pgworker show ID` ended in a
    RecursionError traceback (and the dashboard's job page in a bare 500)."""
    job = (await pgworker.enqueue(conn, "t", {})).job.id
    await conn.execute(
        "INSERT INTO pgworker.job_milestones (job_id, attempt, milestone, detail) "
        "VALUES ($1, 1, 'm', $2::jsonb)",
        job,
        DEEP,
    )
    out = cli("show", str(job), "--dsn", dsn)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "milestone" in out.stderr
    assert "cannot be decoded" in out.stderr
