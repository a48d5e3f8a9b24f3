"""A PgBouncer of one's own (Debian's `pgbouncer`, which .ci/run installs), in transaction mode in
front of a test's PostgreSQL server: started on 127.0.0.1 at a free port with a config written
in a directory of its own, stopped (or killed and started again on the same port) on demand.
The benchmark's pooler system uses it too."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
START_TIMEOUT = 10.0


def available() -> bool:
    return os.access(BINARY, os.X_OK)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class PgBouncer:
    """PgBouncer in front of the server of `server_dsn`, every database of it by the same name.
    `ignore_startup_parameters` None leaves PgBouncer's default (it refuses those it does not
    know, such as plan_cache_mode)."""

    def __init__(
        self,
        server_dsn: str,
        *,
        pool_size: int = 4,
        ignore_startup_parameters: str | None = None,
        max_client_conn: int = 200,
    ) -> None:
        server = urlsplit(server_dsn)
        # A throwaway cluster of the tests listens on a socket, named in the query.
        query = {k: v[-1] for k, v in parse_qs(server.query).items()}
        host = query.get("host") or server.hostname or "127.0.0.1"
        port = query.get("port") or server.port or 5432
        self._user = server.username or "postgres"
        self._server = server
        self.port = _free_port()
        # Readable by the user PgBouncer runs as when started as root (it refuses root).
        self.directory = Path(tempfile.mkdtemp(prefix="pgw-pgbouncer-"))
        self.directory.chmod(0o755)
        (self.directory / "users.txt").write_text(f'"{self._user}" ""\n')
        lines = [
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.directory / 'users.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {pool_size}",
            f"max_client_conn = {max_client_conn}",
            f"admin_users = {self._user}",
            "log_connections = 0",
            "log_disconnections = 0",
        ]
        if ignore_startup_parameters is not None:
            lines.append(f"ignore_startup_parameters = {ignore_startup_parameters}")
        self.config = self.directory / "pgbouncer.ini"
        self.config.write_text("\n".join(lines) + "\n")
        for f in self.directory.iterdir():
            f.chmod(0o644)
        self.log = self.directory / "pgbouncer.log"
        self._process: subprocess.Popen[bytes] | None = None

    def dsn(self, database_dsn: str) -> str:
        """`database_dsn` (a database of the same server), through this PgBouncer."""
        parts = urlsplit(database_dsn)
        netloc = f"{self._user}@127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def start(self) -> None:
        """Start it and wait until it accepts connections (at most START_TIMEOUT seconds)."""
        user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [BINARY, *user, str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: every client and server connection is cut at once."""
        self.stop(signal.SIGKILL)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
