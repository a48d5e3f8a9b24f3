"""`pgworker run --health-file` and `pgworker health`, the probe of a container: a real worker
process writes the file at each heartbeat; the command judges it fresh, stale after a SIGSTOP
longer than the lease or a SIGKILL, unhealthy with a stopped service, healthy while a service
retries; and one line says why for each way the file can be wrong."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import pgworker
from pgworker import cli as cli_module

from .helpers import cli, has_status, logged, spawn_worker, wait_for

aio = pytest.mark.asyncio(loop_scope="session")
SERVICES = {"producer", "heartbeat", "completer", "notifier", "maintenance"}


def health(
    path: Path | str | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    args = ["--health-file", str(path)] if path is not None else []
    return cli("health", *args, env=env, timeout=30)


def healthy(path: Path) -> bool:
    return health(path).returncode == 0


def unhealthy_saying(path: Path, words: str):
    """A predicate for wait_for: `pgworker health` exits 1 with `words` in its one line."""

    def check() -> bool:
        out = health(path)
        return out.returncode == 1 and words in out.stderr

    return check


def written_at(path: Path) -> datetime | None:
    try:
        return datetime.fromisoformat(json.loads(path.read_text())["written_at"])
    except (OSError, ValueError, KeyError):
        return None


def stop(worker: subprocess.Popen) -> int:
    if worker.poll() is None:
        worker.send_signal(signal.SIGCONT)
        worker.terminate()
    return worker.wait(timeout=60)


# --- a real worker -------------------------------------------------------------------------------


@aio
async def test_the_file_is_fresh_while_the_worker_serves_and_stale_when_it_is_frozen_or_killed(
    dsn, conn, tmp_path
):
    path = tmp_path / "health.json"
    worker = spawn_worker(
        "tests.apps.basic", dsn, tmp_path / "log", "--lease", "2", "--health-file", str(path)
    )
    try:
        await wait_for(lambda: healthy(path), timeout=30)
        content = json.loads(path.read_text())
        assert set(content["services"]) == SERVICES
        assert content["lease"] == 2.0 and content["pid"] == worker.pid
        assert {s["state"] for s in content["services"].values()} == {"ok"}
        assert abs(datetime.now(UTC) - written_at(path)) < timedelta(seconds=2)
        out = health(path)
        assert out.stdout.startswith("pgworker health: ok: written ") and out.stderr == ""
        assert len(out.stdout.splitlines()) == 1

        # Rewritten at each heartbeat (a third of the lease), by a rename: a new file each time.
        first, inode = written_at(path), path.stat().st_ino
        await wait_for(lambda: (written_at(path) or first) > first, timeout=5)
        assert path.stat().st_ino != inode
        for _ in range(200):  # a reader never sees half a file
            assert json.loads(path.read_text())["services"]
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pgworker")] == []

        # A job still runs with the file on.
        job = await pgworker.enqueue(conn, "echo", {"n": 1})
        await wait_for(lambda: has_status(conn, job.job.id, "completed"))

        # Frozen longer than the lease: stale; thawed: fresh again.
        worker.send_signal(signal.SIGSTOP)
        await wait_for(unhealthy_saying(path, "is stale by "), timeout=10)
        line = health(path).stderr
        assert line.startswith(f"pgworker health: unhealthy: {path} is stale by ")
        assert "lease 2 s" in line and len(line.splitlines()) == 1
        worker.send_signal(signal.SIGCONT)
        await wait_for(lambda: healthy(path), timeout=10)

        # Killed: nobody writes any more, so the file goes stale.
        worker.kill()
        worker.wait(timeout=30)
        await wait_for(unhealthy_saying(path, "is stale by "), timeout=10)
    finally:
        stop(worker)


@aio
async def test_a_stopped_service_is_unhealthy_and_a_graceful_stop_says_so(dsn, conn, tmp_path):
    path = tmp_path / "health.json"
    worker = spawn_worker(
        "tests.apps.basic",
        dsn,
        tmp_path / "log",
        "--lease",
        "3",
        "--shutdown-timeout",
        "30",
        "--health-file",
        str(path),
    )
    try:
        await wait_for(lambda: healthy(path), timeout=30)
        job = await pgworker.enqueue(conn, "sleep", {"seconds": 60})
        await wait_for(lambda: has_status(conn, job.job.id, "running"))
        worker.terminate()
        # Draining the running job: the producer stopped claiming, the heartbeat still writes.
        await wait_for(unhealthy_saying(path, "service producer stopped"), timeout=10)
        line = health(path).stderr.strip()
        assert (
            line == "pgworker health: unhealthy: service producer stopped (the worker is stopping)"
        )
        worker.send_signal(signal.SIGTERM)  # the second signal hands the job back at once
        assert worker.wait(timeout=30) == 0
        out = health(path)
        assert out.returncode == 1 and "services producer stopped, " in out.stderr, out.stderr
        assert {s["state"] for s in json.loads(path.read_text())["services"].values()} == {
            "stopped"
        }
    finally:
        stop(worker)


@aio
async def test_a_retrying_service_is_healthy_and_the_file_is_written_while_it_fails(
    dsn, conn, tmp_path
):
    """The heartbeat's statements fail (a trigger refuses the worker's row): the heartbeat
    retries, the file keeps being rewritten, and the probe says healthy."""
    path = tmp_path / "health.json"
    worker = spawn_worker(
        "tests.apps.basic", dsn, tmp_path / "log", "--lease", "1.5", "--health-file", str(path)
    )
    try:
        await wait_for(lambda: healthy(path), timeout=30)
        await conn.execute(
            """CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'workers are read-only today'; END $$;
               CREATE TRIGGER refuse BEFORE UPDATE ON pgworker.workers
               FOR EACH ROW EXECUTE FUNCTION public.refuse()"""
        )

        def heartbeat_retrying() -> bool:
            services = json.loads(path.read_text())["services"]
            return services["heartbeat"]["state"] == "retrying"

        await wait_for(heartbeat_retrying, timeout=10)
        seen = written_at(path)
        # Still rewritten while the heartbeat fails, for longer than a lease: never stale.
        await wait_for(lambda: written_at(path) > seen + timedelta(seconds=2), timeout=10)
        assert heartbeat_retrying()
        out = health(path)
        assert out.returncode == 0 and "heartbeat retrying" in out.stdout, out
        error = json.loads(path.read_text())["services"]["heartbeat"]["last_error"]
        assert "workers are read-only today" in error
        await conn.execute("DROP TRIGGER refuse ON pgworker.workers")
        await wait_for(lambda: not heartbeat_retrying(), timeout=10)
    finally:
        assert stop(worker) == 0


@aio
async def test_a_health_file_that_cannot_be_written_stops_the_start(dsn, conn, tmp_path):
    path = tmp_path / "missing-directory" / "health.json"
    log = tmp_path / "log"
    worker = spawn_worker("tests.apps.basic", dsn, log, "--health-file", str(path))
    try:
        assert worker.wait(timeout=60) == 2
    finally:
        stop(worker)
    lines = log.read_text().strip().splitlines()
    assert lines[-1] == (
        f"pgworker run: error: health_file: cannot write {str(path)!r}: No such file or directory"
    ), lines
    assert await conn.fetchval("SELECT count(*) FROM pgworker.workers") == 0


@aio
async def test_a_write_that_fails_later_is_logged_once_and_the_worker_serves_on(
    dsn, conn, tmp_path
):
    """In code (`Worker(..., health_file=...)`): the file's directory goes away while the worker
    serves; one warning, no dead worker, and the file is written again once it can be."""
    from structlog.testing import capture_logs

    from tests.apps.basic import registry

    directory = tmp_path / "run"
    directory.mkdir()
    path = directory / "health.json"
    with capture_logs() as logs:
        async with pgworker.Worker(
            registry, dsn, health_file=path, lease=0.6, poll_interval=0.05
        ) as worker:
            await wait_for(lambda: path.exists())
            path.unlink()
            directory.rmdir()
            await wait_for(lambda: len(logged(logs, "could not write the health file")) > 0)
            job = await pgworker.enqueue(conn, "echo", {"n": 2})
            await wait_for(lambda: has_status(conn, job.job.id, "completed"))
            for _ in range(3):  # three more heartbeats, so as many more failed writes
                seen = await last_seen(conn, worker.worker_id)
                await wait_for(lambda seen=seen: last_seen(conn, worker.worker_id, after=seen))
            beats = len(logged(logs, "health file"))
            directory.mkdir()
            await wait_for(lambda: healthy(path))
            # Every service serves on. A heartbeat late on a loaded machine (the lease is 0.6 s)
            # may be `retrying` for a moment: the worker must come back to `ok`, not stay there.
            await wait_for(lambda: {h["state"] for h in worker.health().values()} == {"ok"})
    [warning] = logged(logs, "could not write the health file")
    assert warning["log_level"] == "warning" and warning["path"] == str(path)
    assert "FileNotFoundError" in warning["error"] and beats == 1


async def last_seen(conn, worker_id: str, after: datetime | None = None) -> datetime | None:
    """The worker's last heartbeat (later than `after`, else None)."""
    seen = await conn.fetchval(
        "SELECT last_seen_at FROM pgworker.workers WHERE worker_id = $1", worker_id
    )
    return seen if after is None or seen > after else None


def test_the_health_file_setting_is_validated():
    assert pgworker.Settings(dsn="postgresql://x/y").health_file is None
    assert pgworker.Settings(dsn="postgresql://x/y", health_file=Path("/tmp/h")).health_file == (
        "/tmp/h"
    )
    env = {"PGWORKER_DSN": "postgresql://x/y", "PGWORKER_HEALTH_FILE": "/tmp/h.json"}
    assert pgworker.Settings.from_env(env).health_file == "/tmp/h.json"
    for bad in ("", "a\x00b", 3, "x" * 5000):
        with pytest.raises(pgworker.ConfigError) as caught:
            pgworker.Settings(dsn="postgresql://x/y", health_file=bad)
        assert caught.value.field == "health_file"


# --- each way the file can be wrong: one line saying why ------------------------------------------


def record(path: Path, age: float = 0.0, lease: float = 30.0, **states: str) -> Path:
    services = {name: "ok" for name in sorted(SERVICES)} | states
    path.write_text(
        json.dumps(
            {
                "written_at": (datetime.now(UTC) - timedelta(seconds=age)).isoformat(),
                "lease": lease,
                "stopping": False,
                "services": {
                    name: {"state": state, "last_success": None} for name, state in services.items()
                },
            }
        )
    )
    return path


def run_health(capsys, *args: str) -> tuple[int, str, str]:
    code = cli_module.main(["health", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_fresh_file_with_services_ok_or_retrying_is_healthy(tmp_path, capsys):
    path = record(tmp_path / "h.json", age=5, heartbeat="retrying", completer="retrying")
    code, out, err = run_health(capsys, "--health-file", str(path))
    assert (code, err) == (0, "")
    # The age is read when the command runs: a loaded machine may add to the 5 s.
    written = re.match(r"pgworker health: ok: written (\d+\.\d) s ago; ", out)
    assert written and 5.0 <= float(written[1]) < 15.0 and out.count("\n") == 1, out
    assert "heartbeat retrying" in out and "producer ok" in out


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no health file at {path} (is `pgworker run --health-file {path}` running?)"),
        ("{not json", "{path} holds unreadable JSON (Expecting property name"),
        ("", "{path} holds unreadable JSON ("),
        ("[1, 2]", "{path} is not a pgworker health file (not a JSON object)"),
        ('{"lease": 30, "services": {}}', "{path} is not a pgworker health file (no valid"),
        (
            '{"written_at": "2030-01-01T00:00:00", "lease": 30, "services": {}}',
            "{path} is not a pgworker health file (written_at has no time zone)",
        ),
        (
            '{"written_at": "2030-01-01T00:00:00+00:00", "lease": "x", "services": {}}',
            "{path} is not a pgworker health file (no valid lease)",
        ),
        (
            '{"written_at": "2030-01-01T00:00:00+00:00", "lease": 30, "services": {"a": 1}}',
            "{path} is not a pgworker health file (no valid services)",
        ),
        (
            '{"written_at": "2030-01-01T00:00:00+00:00", "lease": 30, "services": {}}',
            "{path} lists no service: the worker has not started serving",
        ),
    ],
)
def test_a_missing_or_unreadable_file_is_unhealthy_in_one_line(tmp_path, capsys, content, says):
    path = tmp_path / "h.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_health(capsys, "--health-file", str(path))
    assert (code, out) == (1, "")
    assert err.startswith("pgworker health: unhealthy: " + says.format(path=path)), err
    assert err.count("\n") == 1


def test_a_file_older_than_its_lease_is_stale_by_so_many_seconds(tmp_path, capsys):
    path = record(tmp_path / "h.json", age=42, lease=30)
    code, _, err = run_health(capsys, "--health-file", str(path))
    assert code == 1
    stale = re.match(rf"pgworker health: unhealthy: {re.escape(str(path))} is stale by (\d+) s "
                     r"\(written (\d+) s ago", err)  # fmt: skip
    assert stale and 42 <= int(stale[2]) < 52 and int(stale[2]) - int(stale[1]) == 30, err
    fresh = record(tmp_path / "h2.json", age=25, lease=30)
    assert run_health(capsys, "--health-file", str(fresh))[0] == 0


def test_a_stopped_service_is_named(tmp_path, capsys):
    path = record(tmp_path / "h.json", completer="stopped")
    code, _, err = run_health(capsys, "--health-file", str(path))
    assert (code, err) == (1, "pgworker health: unhealthy: service completer stopped\n")
    path = record(tmp_path / "h.json", completer="stopped", notifier="stopped")
    assert run_health(capsys, "--health-file", str(path))[2] == (
        "pgworker health: unhealthy: services completer stopped, notifier stopped\n"
    )


def test_the_file_comes_from_the_variable_or_the_option(tmp_path, capsys, monkeypatch):
    path = record(tmp_path / "h.json")
    monkeypatch.setenv("PGWORKER_HEALTH_FILE", str(path))
    assert run_health(capsys)[0] == 0
    monkeypatch.delenv("PGWORKER_HEALTH_FILE")
    code, _, err = run_health(capsys)
    assert code == 2 and err.startswith("pgworker health: error: --health-file: ")
    assert "PGWORKER_HEALTH_FILE" in err


def test_the_command_reads_the_file_only(tmp_path):
    """A probe needs neither a DSN nor a database: none is set here and it answers."""
    out = health(record(tmp_path / "h.json"), env={"PGWORKER_DSN": "", "DATABASE_URL": ""})
    assert out.returncode == 0, out.stderr


# --- health files that are not files, never end, or hold garbage -----------------------------


def health_probe(path: Path, timeout: float = 20) -> subprocess.CompletedProcess[str]:
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


def test_a_fifo_at_the_health_file_path_is_unhealthy_at_once_not_a_hung_probe(tmp_path):
    """open() of a FIFO blocks until a writer comes: the probe hung (till its own timeout)."""
    path = tmp_path / "health.json"
    os.mkfifo(path)
    out = health_probe(path, timeout=10)
    assert out.returncode == 1
    assert "not a regular file" in out.stderr


def test_a_health_file_turned_into_an_endless_file_is_unhealthy_without_reading_it_all(tmp_path):
    """A symlink to /dev/zero (or a huge file): the probe read it all into memory, forever."""
    path = tmp_path / "health.json"
    path.symlink_to("/dev/zero")
    out = health_probe(path, timeout=10)
    assert out.returncode == 1 and "not a regular file" in out.stderr
    big = tmp_path / "big.json"
    big.write_text(fresh()[:-1] + ', "x": "' + "a" * (2 * 1024 * 1024) + '"}')
    out = health_probe(big)
    assert out.returncode == 1 and "over 1,048,576 bytes" in out.stderr


def test_a_symlink_to_a_fresh_file_is_still_judged_and_a_directory_is_unhealthy(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(fresh())
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert health_probe(link).returncode == 0
    directory = tmp_path / "dir"
    directory.mkdir()
    out = health_probe(directory)
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
    out = health_probe(path)
    assert out.returncode == 1, out.stdout


def test_a_health_file_of_deep_json_or_lone_surrogates_is_judged_in_one_line(tmp_path):
    """json.loads raised RecursionError (not ValueError) on deep JSON, and a service name or
    state holding a lone surrogate ("\\ud800", valid JSON) could not be printed: both ended
    the probe with a traceback instead of its one line."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    out = health_probe(deep)
    assert out.returncode == 1 and "unreadable JSON" in out.stderr
    assert "Traceback" not in out.stderr
    named = tmp_path / "named.json"
    named.write_text(fresh(services={"\ud800x": {"state": "ok"}}))
    out = health_probe(named)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("pgworker health: ok: ") and "\\ud800x ok" in out.stdout
    state = tmp_path / "state.json"
    state.write_text(fresh(services={"a": {"state": "bad\ud800"}}))
    out = health_probe(state)
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
