"""Bounded waits on conditions, small readers of the tables, a faked claim, and a proxy that
breaks connections at chosen points of the PostgreSQL protocol."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import os
import re
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio

ROOT = Path(__file__).resolve().parent.parent


def spawn_worker(
    module: str, dsn: str, log: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """A real `pgworker run MODULE` process serving `dsn`, its output in `log`."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    environment.update(PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "pgworker", "run", module, *args, "--dsn", dsn],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=environment,
        cwd=ROOT,
    )


class _Output(io.TextIOWrapper):
    """A process's stdout or stderr as `pgworker` meets it: UTF-8, strict (a lone surrogate
    fails as it would on a real stream), not a terminal."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)

    def value(self) -> bytes:
        self.flush()
        return cast(io.BytesIO, self.buffer).getvalue()


_CONFIGURES_THE_PROCESS = ("run", "serve", "replay")
"""Commands that install signal handlers or configure the process's logging: `cli` runs them
as processes of their own (`cli_process`)."""

_in_process = threading.Lock()


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    input: str = "",
    text: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[Any]:
    """`pgworker ARGS` in this process: the CLI's `main` called with ARGS in a thread of its own
    (it runs an event loop, and the test's may be running), stdout and stderr captured, its exit
    status returned, as `subprocess.run` would give them (bytes unless `text`). PGWORKER_* and
    DATABASE_URL are unset for it, then `env` applied; stdin holds `input` and is not a
    terminal. Many times cheaper than a process. The commands that install signal handlers or
    configure the process's logging (run, serve, replay) run as a process (`cli_process`), as do
    the tests that need one (signals, two clients each numbering its prepared statements from
    1, the `python -m pgworker` entry point)."""
    if not args or args[0] in _CONFIGURES_THE_PROCESS:
        return cli_process(*args, env=env, input=input, text=text, timeout=timeout)
    from pgworker.cli import main

    stdout, stderr = _Output(), _Output()
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(main(list(args)))
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=stderr)
                outcome.append(1)
            else:
                outcome.append(exc.code or 0)
        except BaseException as exc:  # a crash, as Python would report it: status 1
            traceback.print_exception(exc, file=stderr)
            outcome.append(1)

    variables = {k: v for k, v in os.environ.items() if not k.startswith(_CLI_VARIABLES)}
    variables.update(env or {})
    with _in_process, _environment(variables), contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        stack.enter_context(_patched(sys, "stdin", io.StringIO(input)))
        worker = threading.Thread(target=call, name="pgworker-cli", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise subprocess.TimeoutExpired(["pgworker", *args], timeout)
    out, err = stdout.value(), stderr.value()
    if text:
        return subprocess.CompletedProcess(
            ["pgworker", *args], outcome[0], out.decode(), err.decode()
        )
    return subprocess.CompletedProcess(["pgworker", *args], outcome[0], out, err)


_CLI_VARIABLES = ("PGWORKER_", "DATABASE_URL")


def cli_process(
    *args: str,
    env: dict[str, str] | None = None,
    input: str | None = None,
    text: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[Any]:
    """`python -m pgworker ARGS`, a process of its own: for the commands that install signal
    handlers or configure logging, and the tests of the entry point itself. Its environment as
    `cli`'s; stdin is empty (or `input`)."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith(_CLI_VARIABLES)}
    variables.update(PYTHONPATH=str(ROOT), **(env or {}))
    done = subprocess.run(
        [sys.executable, "-m", "pgworker", *args],
        capture_output=True,
        text=text,
        input=(input or "") if text else (input or "").encode(),
        env=variables,
        cwd=ROOT,
        timeout=timeout,
    )
    done.args = ["pgworker", *args]
    return done


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


async def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    """Poll `predicate` (sync or async) until it returns a truthy value; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        await anyio.sleep(every)


async def statuses(conn: Any) -> dict[str, int]:
    rows = await conn.fetch("SELECT status, count(*) AS n FROM pgworker.jobs GROUP BY status")
    return {r["status"]: r["n"] for r in rows}


async def all_finished(conn: Any) -> bool:
    return not await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
    )


async def count_function_calls(conn: Any) -> None:
    """Have PostgreSQL count the calls of PL/pgSQL functions in `conn`'s database, in the
    sessions that start from now on (pg_stat_user_functions)."""
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'pl'")


async def pooled_calls(conn: Any, *statements: str, timeout: float = 20) -> dict[str, int]:
    """The calls of each pooled function of the pgworker schema (`_pooled_<statement>_<digest>`),
    by statement, once each of `statements` was called: the database's other sessions are ended
    first, since a session's counts reach the statistics when it ends."""
    await conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )

    async def called() -> dict[str, int] | None:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = await conn.fetch(
            "SELECT substring(funcname from '^_pooled_(.*)_[0-9a-f]{12}$') AS statement, calls "
            "FROM pg_stat_user_functions WHERE schemaname = 'pgworker'"
        )
        found = {r["statement"]: r["calls"] for r in rows if r["statement"]}
        return found if all(found.get(s) for s in statements) else None

    return await wait_for(called, timeout=timeout, every=0.2)


async def attempts(conn: Any, job_id: int) -> list[Any]:
    return await conn.fetch(
        "SELECT * FROM pgworker.job_attempts WHERE job_id = $1 ORDER BY attempt", job_id
    )


async def fake_claim(conn, job_id: int, worker_id: str = "ghost", lease_s: float = -1) -> datetime:
    """Make `job_id` look claimed by a worker that is gone, its lease ending `lease_s` from now;
    returns the claim's time."""
    claimed_at = await conn.fetchval(
        """UPDATE pgworker.jobs SET status = 'running', attempts = attempts + 1, worker_id = $2,
               max_retries = coalesce(max_retries, 3), claimed_at = clock_timestamp(),
               lease_expires_at = now() + make_interval(secs => $3)
           WHERE id = $1 RETURNING claimed_at""",
        job_id,
        worker_id,
        lease_s,
    )
    await conn.execute(
        """INSERT INTO pgworker.job_attempts
               (job_id, attempt, type, queue, worker_id, correlation_id, started_at)
           SELECT id, attempts, type, queue, worker_id, correlation_id, claimed_at
           FROM pgworker.jobs WHERE id = $1""",
        job_id,
    )
    return claimed_at


def logged(entries: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    """The captured log entries (structlog.testing.capture_logs) whose event contains `event` and
    that carry `fields`."""
    return [
        e
        for e in entries
        if event in str(e.get("event")) and all(e.get(k) == v for k, v in fields.items())
    ]


class _Link:
    """One proxied connection: a client's socket and the server's, joined."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.application_name = ""
        self.flowing = asyncio.Event()  # cleared: nothing more reaches the client
        self.flowing.set()
        self.swallowing = False  # the server's replies are dropped until its ReadyForQuery
        self.matched: set[bytes] = set()  # prepared statements that the cut waits for
        self.closed = asyncio.Event()

    def pause(self) -> None:
        """Stop passing the server's bytes to the client; both sockets stay open."""
        self.flowing.clear()

    def close(self) -> None:
        for writer in (self.client, self.server):
            with contextlib.suppress(Exception):
                writer.close()
        self.closed.set()


class PgProxy:
    """A TCP proxy in front of PostgreSQL that reads the wire protocol (v3, without TLS), so that
    a test can break one connection at a chosen point while the others flow: `pause` what the
    server sends a connection (its socket stays open: a connection that stops receiving), or
    `cut_after` a statement (the server runs and commits it, the client never gets the reply and
    sees its connection lost); or `stall` every connection, new ones too (a database that stops
    answering: nothing is forwarded either way, every socket stays open) until `resume`."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        query = dict(parse_qsl(parts.query))
        self._socket: str | None = None
        if query.get("host", "").startswith("/"):  # a server on a Unix socket (devdb)
            self._socket = f"{query.pop('host')}/.s.PGSQL.{query.pop('port', '5432')}"
        self._dsn = parts._replace(query=urlencode(query))
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.links: list[_Link] = []
        self._cut: tuple[Callable[[_Link, str], bool], bytes] | None = None
        self.cut_done = asyncio.Event()
        self._flowing = asyncio.Event()  # cleared: nothing is forwarded, either way
        self._flowing.set()

    def stall(self) -> None:
        """Stop forwarding anything, either way, on every connection (and new ones): what a
        client sees of a database that hangs. Bytes already read wait for `resume`."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    @property
    def dsn(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        netloc = self._dsn.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        netloc = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        query = "&".join(q for q in (self._dsn.query, "sslmode=disable") if q)
        return urlunsplit(self._dsn._replace(netloc=netloc, query=query))

    async def __aenter__(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for link in self.links:
            link.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def link(self, application_name: str) -> _Link | None:
        """The open connection whose application_name starts with `application_name`."""
        for link in self.links:
            if link.application_name.startswith(application_name) and not link.closed.is_set():
                return link
        return None

    def cut_after(self, statement: Callable[[_Link, str], bool], parameter: bytes) -> None:
        """Arm one cut: the next execution of a statement for which `statement(link, text)` is
        true, bound with parameters that contain the bytes `parameter`, reaches the server; the
        server's whole reply (through its ReadyForQuery: the statement committed) is dropped and
        both sockets closed."""
        self._cut = (statement, parameter)
        self.cut_done.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._socket is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        link = _Link(writer, up_writer)
        self.links.append(link)
        for pump in (self._client_to_server(link, reader), self._server_to_client(link, up_reader)):
            task = asyncio.create_task(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _client_to_server(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            if code == 196608:  # StartupMessage, protocol 3.0: name/value pairs
                pairs = body[4:].split(b"\0")
                params = dict(zip(pairs[::2], pairs[1::2], strict=False))
                link.application_name = params.get(b"application_name", b"").decode()
            elif code != 80877102:  # a CancelRequest needs no reading; TLS would be unreadable
                raise AssertionError(f"PgProxy needs sslmode=disable (request code {code})")
            await self._flowing.wait()
            link.server.write(struct.pack("!i", length) + body)
            while True:
                head = await reader.readexactly(5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = await reader.readexactly(length - 4)
                self._watch(link, kind, body)
                await self._flowing.wait()
                link.server.write(head + body)
                await link.server.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            link.close()

    def _watch(self, link: _Link, kind: bytes, body: bytes) -> None:
        """Track the statements the armed cut waits for; start it on their execution."""
        if self._cut is None:
            return
        statement, parameter = self._cut
        if kind == b"P":  # Parse: statement name, query text, ...
            name, _, rest = body.partition(b"\0")
            text = rest.partition(b"\0")[0].decode(errors="replace")
            if statement(link, text):
                link.matched.add(name)
            else:
                link.matched.discard(name)
        elif kind == b"B":  # Bind: portal name, statement name, parameters
            name = body.partition(b"\0")[2].partition(b"\0")[0]
            if name in link.matched and parameter in body:
                self._cut = None
                link.swallowing = True

    async def _server_to_client(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await reader.readexactly(5)
                body = await reader.readexactly(struct.unpack("!i", head[1:])[0] - 4)
                if link.swallowing:
                    if head[:1] == b"Z":  # ReadyForQuery: the statement's transaction is over
                        link.close()
                        self.cut_done.set()
                        return
                    continue
                await link.flowing.wait()
                await self._flowing.wait()
                link.client.write(head + body)
                await link.client.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            link.close()


UPDATES_ATTEMPTS = re.compile(r"UPDATE\s+\S*job_attempts\b", re.IGNORECASE)


def database_of(dsn: str) -> str:
    """The database a DSN names (its path), whatever its query holds (a socket directory)."""
    return urlsplit(dsn).path.lstrip("/")


async def status_of(conn: Any, job_id: int) -> str:
    return await conn.fetchval("SELECT status FROM pgworker.jobs WHERE id = $1", job_id)


async def has_status(conn: Any, job_id: int, status: str) -> bool:
    return await status_of(conn, job_id) == status


async def serves_on(conn: Any, timeout: float = 20) -> None:
    """The worker under test still serves: a `plain` job enqueued now completes."""
    import pgworker

    after = await pgworker.enqueue(conn, "plain", {"after": True})
    await wait_for(lambda: has_status(conn, after.job.id, "completed"), timeout=timeout)


async def poison_in_a_claim(serving: Any, conn: Any, type_: str, payload: Any = None) -> Any:
    """Enqueue a poison job with three `plain` ones (one claim takes all four), serve them with
    `serving` (an async context manager giving a running Worker) until all are done, check that
    the plain ones completed, that the worker serves on and that none of its services stopped;
    return the poison job."""
    import pgworker

    poison = await pgworker.enqueue(conn, type_, {} if payload is None else payload)
    others = await pgworker.enqueue_many(
        conn, [pgworker.JobSpec("plain", {"n": n}) for n in range(3)]
    )
    async with serving as worker:
        await wait_for(lambda: all_finished(conn), timeout=20)
        for r in others:
            assert await status_of(conn, r.job.id) == "completed"
        await serves_on(conn)
        assert all(h["state"] != "stopped" for h in worker.health().values())
    claims = await conn.fetchval(
        "SELECT count(DISTINCT claimed_at) FROM pgworker.jobs WHERE id = ANY($1::bigint[])",
        [poison.job.id, *(r.job.id for r in others)],
    )
    assert claims == 1, "the plain jobs were not in the poison job's claim"
    job = await pgworker.get_job(conn, poison.job.id)
    assert job is not None
    return job


@contextlib.asynccontextmanager
async def serving_guarded(registry: Any, dsn: str, **options: Any) -> AsyncIterator[Any]:
    """A worker serving `dsn`; anything it raises (a BaseException group when it dies) is turned
    into a test failure, so that a broken worker fails the test rather than the session."""
    import pytest

    import pgworker

    options.setdefault("poll_interval", 0.05)
    options.setdefault("concurrency", 4)
    try:
        with anyio.fail_after(60):
            async with pgworker.Worker(registry, dsn, **options) as worker:
                yield worker
    except BaseException as exc:
        if isinstance(exc, AssertionError | pytest.fail.Exception):
            raise
        pytest.fail(f"the worker raised {exc!r}")
