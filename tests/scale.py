"""`make scale`: hosts and cuts. Four worker hosts, each a network namespace joined by a veth
pair to a private bridge, serve a throwaway PostgreSQL that listens on the bridge's address
alone; each host runs a real `pgworker run tests.apps.scale` process with JSON logs.

1. Throughput with 1, 2 and 4 hosts: SCALE_JOBS jobs per host whose handlers wait 20 ms, timed
   from the first attempt's start to the last one's end.
2. Two cuts of the host holding the most long jobs, in the middle of its work: (a) its link taken
   down, (b) its packets dropped silently (`tc netem loss 100%`, else an nftables drop, else its
   bridge port disabled; the summary says which). Its open attempts must be rescued once their
   lease expired (and not before), and run again on the other hosts; once healed, it must serve
   again, and its late outcomes must not overwrite what the rescue recorded. The time from the
   cut to the cut host stopping its attempts (the last of its handlers ending, from its log) is
   printed always, and asserted to come before the lease expires when the running code fences
   itself (it logs FENCE_EVENTS: see `self_fencing`).
3. At the end (workers stopped with SIGTERM, their outcomes flushed), every job completed exactly
   once, every other attempt of it `lost`, and its result names the completed attempt.

Needs root (namespaces, a bridge, veth pairs); elsewhere it prints why it skips and exits 0.
Bounded: every wait has a limit, and the whole run BUDGET seconds. Removes its namespaces,
bridge, veths, rules and cluster whatever happens (SIGTERM and SIGINT included), and at start
what a crashed earlier run left (names starting with PREFIX). SCALE_JOBS, SCALE_LEASE and
SCALE_CONCURRENCY tune it; SCALE_BREAK=rescue breaks the rescue on purpose (tests/apps/scale.py):
the run must then fail, saying which promise broke.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

import pgworker
from examples import devdb
from pgworker import JobSpec

from .harness import Broken, Skip, arm, disarm, ended, wait_until

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "pgws"
BRIDGE = f"{PREFIX}-br"
NET = "10.213.0"
DB_ADDR = f"{NET}.1"
PORT = 54213
HOSTS = 4
JOBS = int(os.environ.get("SCALE_JOBS", "400"))
LEASE = float(os.environ.get("SCALE_LEASE", "5"))
CONCURRENCY = int(os.environ.get("SCALE_CONCURRENCY", "4"))
HOLD = 2 * LEASE
"""How long a `hold` job's handler waits: past the lease, so that a cut host either stops it
(self-fencing) or visibly runs it on after its job was rescued."""
BUDGET = 300
SCALING = {2: 1.5, 4: 2.4}
"""The least speed-up over one host that 2 and 4 hosts must reach (near-linear, with room for a
shared 2-core machine)."""
FENCE_EVENTS = ("lost contact with the database",)
"""What a worker that fences itself logs when it stops its attempts; the
running code is taken to fence itself when its source logs one of these."""
TICK_S = 0.02


def sh(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r


def in_ns(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", ns, *args, check=check)


def self_fencing() -> str | None:
    """The fence event the running pgworker logs, when its source has one."""
    source = "\n".join(
        p.read_text(errors="replace") for p in Path(pgworker.__file__).parent.glob("*.py")
    )
    for found in re.finditer(r'"([^"\n]*)"', source):
        if any(e in found.group(1) for e in FENCE_EVENTS):
            return found.group(1)
    return None


# The network ----------------------------------------------------------------------------------


@dataclass
class Host:
    n: int
    logs: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"h{self.n}"

    @property
    def ns(self) -> str:
        return f"{PREFIX}-h{self.n}"

    @property
    def nic(self) -> str:
        """Its end of the veth pair, inside its namespace."""
        return f"{PREFIX}-h{self.n}n"

    @property
    def port(self) -> str:
        """The bridge's end of its veth pair."""
        return f"{PREFIX}-h{self.n}b"

    @property
    def addr(self) -> str:
        return f"{NET}.{10 + self.n}"

    @property
    def log(self) -> Path:
        return self.logs / f"{self.name}.log"

    def start(self, dsn: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "pgworker", "run"]
        cmd += ["tests.apps.scale", "--dsn", dsn, "--worker-id", self.name]
        cmd += ["--lease", str(LEASE), "--concurrency", str(CONCURRENCY)]
        cmd += ["--shutdown-timeout", "10", "--log-format", "json", "--log-level", "info"]
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT
            )

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL past a bound; the exit status (None when killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def kill(self) -> None:
        """SIGKILL, when it still runs: the run ended early, and its database goes too."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def entries(self, since: int = 0) -> list[dict[str, Any]]:
        """Its JSON log lines from byte `since` on."""
        out = []
        with contextlib.suppress(FileNotFoundError), self.log.open("rb") as f:
            f.seek(since)
            for line in f.read().decode(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict):
                        out.append(entry)
        return out


def _at(entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(entry["timestamp"]).timestamp()


class Network:
    """The bridge, the namespaces and their veth pairs; `drop_by` is how (b) drops packets."""

    def __init__(self, hosts: list[Host]) -> None:
        self.hosts = hosts
        self.drop_by = ""

    @staticmethod
    def clean() -> list[str]:
        """Remove what a run left behind (namespaces, links, the processes inside); what it
        removed."""
        removed = []
        for line in sh("ip", "netns", "list").stdout.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{PREFIX}-"):
                for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                sh("ip", "netns", "del", ns, check=False)
                removed.append(f"namespace {ns}")
        for line in sh("ip", "-o", "link", "show").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith(f"{PREFIX}-"):
                sh("ip", "link", "del", name, check=False)
                removed.append(f"link {name}")
        return removed

    def build(self) -> None:
        taken = sh("ip", "-o", "-4", "addr", "show", "to", f"{NET}.0/24").stdout.strip()
        if taken:
            raise Skip(f"{NET}.0/24 is already used on this machine: {taken.splitlines()[0]}")
        try:
            sh("ip", "link", "add", BRIDGE, "type", "bridge")
        except RuntimeError as exc:  # root without CAP_NET_ADMIN: an unprivileged container
            raise Skip(f"cannot create a bridge here ({exc})") from None
        sh("ip", "addr", "add", f"{DB_ADDR}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for h in self.hosts:
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", h.port, "type", "veth", "peer", "name", h.nic)
            sh("ip", "link", "set", h.nic, "netns", h.ns)
            sh("ip", "link", "set", h.port, "master", BRIDGE, "up")
            in_ns(h.ns, "ip", "addr", "add", f"{h.addr}/24", "dev", h.nic)
            in_ns(h.ns, "ip", "link", "set", h.nic, "up")
            in_ns(h.ns, "ip", "link", "set", "lo", "up")
        self.drop_by = self._drop_method(self.hosts[-1])

    def _drop_method(self, probe: Host) -> str:
        """netem when this kernel has it, else nftables when `nft` is installed, else the
        bridge port's state."""
        r = sh("tc", "-n", probe.ns, "qdisc", "add", "dev", probe.nic, "root", "netem", "loss",
               "100%", check=False)  # fmt: skip
        if r.returncode == 0:
            sh("tc", "-n", probe.ns, "qdisc", "del", "dev", probe.nic, "root")
            return "tc netem loss 100%"
        if shutil.which("nft"):
            return "nftables drop (no netem in this kernel)"
        return "bridge port disabled (neither netem nor nft here)"

    def cut(self, h: Host, how: str) -> None:
        if how == "down":
            in_ns(h.ns, "ip", "link", "set", h.nic, "down")
        elif self.drop_by.startswith("tc"):
            in_ns(h.ns, "tc", "qdisc", "add", "dev", h.nic, "root", "netem", "loss", "100%")
        elif self.drop_by.startswith("nft"):
            in_ns(h.ns, "nft", "add", "table", "inet", PREFIX)
            for chain, hook in (("in", "input"), ("out", "output")):
                spec = f"{{ type filter hook {hook} priority 0; policy drop; }}"
                in_ns(h.ns, "nft", "add", "chain", "inet", PREFIX, chain, spec)
        else:
            sh("bridge", "link", "set", "dev", h.port, "state", "0")

    def heal(self, h: Host, how: str) -> None:
        if how == "down":
            in_ns(h.ns, "ip", "link", "set", h.nic, "up")
        elif self.drop_by.startswith("tc"):
            in_ns(h.ns, "tc", "qdisc", "del", "dev", h.nic, "root")
        elif self.drop_by.startswith("nft"):
            in_ns(h.ns, "nft", "delete", "table", "inet", PREFIX)
        else:
            sh("bridge", "link", "set", "dev", h.port, "state", "3")


def pg_bindir() -> Path:
    """The local PostgreSQL's binaries, else the embedded package's."""
    found = devdb.local_bindir()
    if found is not None:
        return found
    try:
        return devdb.embedded_bindir()
    except ModuleNotFoundError as exc:
        raise Skip(f"no PostgreSQL binaries: {exc}") from None


def clean_clusters() -> list[str]:
    removed = []
    for data in Path(tempfile.gettempdir()).glob(f"{PREFIX}-pg-*"):
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(Skip):
                devdb.Cluster(data, bindir=pg_bindir()).stop("immediate")
        shutil.rmtree(data, ignore_errors=True)
        removed.append(f"cluster {data}")
    for logs in Path(tempfile.gettempdir()).glob(f"{PREFIX}-logs-*"):
        shutil.rmtree(logs, ignore_errors=True)
    return removed


# The measures ---------------------------------------------------------------------------------


async def enqueue(conn: asyncpg.Connection, type_: str, batch: str, n: int, **payload: Any) -> None:
    specs = [JobSpec(type_, {"batch": batch, **payload}) for _ in range(n)]
    for i in range(0, n, 2000):
        await pgworker.enqueue_many(conn, specs[i : i + 2000])


async def unfinished(conn: asyncpg.Connection, batch: str | None = None) -> int:
    n: int = await conn.fetchval(
        "SELECT count(*) FROM pgworker.jobs WHERE status IN ('pending', 'running')"
        " AND ($1::text IS NULL OR payload->>'batch' = $1)",
        batch,
    )
    return n


async def unfinished_jobs(conn: asyncpg.Connection) -> list[str]:
    """The first unfinished jobs, described: what a failed wait for them must show."""
    rows = await conn.fetch(
        "SELECT id, type, status, worker_id, attempts,"
        " extract(epoch FROM run_at - now())::float8 AS run_in,"
        " extract(epoch FROM lease_expires_at - now())::float8 AS lease_in"
        " FROM pgworker.jobs WHERE status IN ('pending', 'running') ORDER BY id LIMIT 10"
    )
    return [
        f"{r['id']} {r['type']} {r['status']} worker={r['worker_id']} attempts={r['attempts']}"
        f" run_in={r['run_in']:.1f}s"
        + ("" if r["lease_in"] is None else f" lease_in={r['lease_in']:.1f}s")
        for r in rows
    ]


async def serving(conn: asyncpg.Connection, hosts: list[Host]) -> None:
    names = [h.name for h in hosts]

    async def registered() -> bool:
        n = await conn.fetchval(
            "SELECT count(*) FROM pgworker.workers WHERE worker_id = ANY($1)", names
        )
        for h in hosts:
            if h.proc is not None and h.proc.poll() is not None:
                tail = h.log.read_text(errors="replace")[-1500:]
                raise Broken(f"worker {h.name} exited ({h.proc.returncode}) at start:\n{tail}")
        return bool(n == len(names))

    await wait_until(f"workers {', '.join(names)} registered", registered, 60)


async def throughput(conn: asyncpg.Connection, hosts: list[Host], dsn: str) -> tuple[float, float]:
    """Jobs per second with `hosts` serving, and the seconds the batch took."""
    for h in hosts:
        if h.proc is None:
            h.start(dsn)
    await serving(conn, hosts)
    batch = f"tp-{len(hosts)}"
    n = JOBS * len(hosts)
    await enqueue(conn, "tick", batch, n)
    limit = 10 + n * TICK_S / CONCURRENCY * 3
    await wait_until(
        f"{n} jobs on {len(hosts)} hosts", lambda: _none(unfinished(conn, batch)), limit
    )
    took = await conn.fetchval(
        "SELECT extract(epoch FROM max(a.finished_at) - min(a.started_at))::float8"
        " FROM pgworker.job_attempts a JOIN pgworker.jobs j ON j.id = a.job_id"
        " WHERE j.payload->>'batch' = $1",
        batch,
    )
    return n / took, took


async def _none(count: Any) -> bool:
    return bool(await count == 0)


@dataclass
class Cut:
    """One cut's figures, as far as it got (None: not measured)."""

    how: str
    label: str
    host: str = ""
    leader: bool = False
    open_holds: int = 0
    open_ticks: int = 0
    to_leases_expired: float | None = None
    to_rescue: tuple[float, float] | None = None
    to_stopped: float | None = None
    stop_how: str = ""
    before_lease: bool | None = None
    to_rerun: float | None = None
    to_serving: float | None = None
    dropped_logged: int | None = None
    fence_logged: int | None = None
    attempts: list[tuple[int, int]] = field(default_factory=list)

    def stopped(self) -> str:
        if self.to_stopped is None:
            return self.stop_how or "-"
        when = "before" if self.before_lease else "after"
        return f"{self.to_stopped:.1f} s ({self.stop_how}; {when} its leases expired)"

    def rows(self) -> list[tuple[str, Any]]:
        def s(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} s"

        first, last = self.to_rescue or (None, None)
        return [
            (
                f"cut ({self.label})",
                f"host {self.host}{', the leader' if self.leader else ''}; open at the cut:"
                f" {self.open_holds} long, {self.open_ticks} short",
            ),
            ("  cut -> last lease expired", s(self.to_leases_expired)),
            ("  cut -> rescued", f"{s(first)} first, {s(last)} last"),
            ("  cut -> run again elsewhere", s(self.to_rerun)),
            ("  cut -> cut host stopped its attempts", self.stopped()),
            ("  heal -> serving again", s(self.to_serving)),
            ("  late outcomes dropped (its log)", self._n(self.dropped_logged)),
            ("  fence events (its log)", self._n(self.fence_logged)),
        ]

    @staticmethod
    def _n(v: int | None) -> str:
        return "-" if v is None else str(v)


async def cut(
    c: Cut, conn: asyncpg.Connection, net: Network, hosts: list[Host], fence: str | None
) -> None:
    """Cut a host off (`c.how`), heal it, and fill `c` in; Broken when a promise fails."""
    how, label = c.how, c.label
    batch = f"cut-{how}"
    # Claimed in id order, a slot's worth at a time: each host's first claim takes half long
    # jobs, half short ones, and the short ones go on flowing through the other half.
    hold = JobSpec("hold", {"batch": batch, "seconds": HOLD})
    tick = JobSpec("tick", {"batch": batch})
    group = [hold] * (CONCURRENCY // 2) + [tick] * (CONCURRENCY - CONCURRENCY // 2)
    await pgworker.enqueue_many(conn, group * HOSTS + [tick] * 150 * HOSTS)

    async def holds_running() -> list[asyncpg.Record]:
        rows = await conn.fetch(
            "SELECT worker_id, count(*) FILTER (WHERE type = 'hold') AS holds, count(*) AS n"
            " FROM pgworker.jobs WHERE status = 'running' AND payload->>'batch' = $1"
            " GROUP BY worker_id",
            batch,
        )
        total = sum(r["holds"] for r in rows)
        return rows if total == HOSTS * (CONCURRENCY // 2) else []

    rows = await wait_until("the long jobs all running", holds_running, 20, every=0.02)
    leader = await conn.fetchval(
        "SELECT worker_id FROM pgworker.leader WHERE name = 'maintenance' AND expires_at > now()"
    )
    # A host running long jobs and short ones: the leader when the link goes down (its successor
    # must take the rescue over), another host when packets are dropped.
    best = max(
        rows,
        key=lambda r: (
            r["holds"] > 0,
            r["n"] > r["holds"],
            (r["worker_id"] == leader) == (how == "down"),
            r["holds"],
        ),
    )
    victim = next(h for h in hosts if h.name == best["worker_id"])
    c.host = victim.name
    c.leader = victim.name == leader
    since = victim.size()
    t_cut = time.time()
    net.cut(victim, how)

    # The attempts the victim had open at the cut; their last leases, as long as they hold.
    leases: dict[tuple[int, int], float] = {}

    async def victims_attempts() -> list[asyncpg.Record]:
        return await conn.fetch(
            "SELECT a.job_id, a.attempt, a.type, a.outcome,"
            " extract(epoch FROM a.finished_at)::float8 AS finished,"
            " extract(epoch FROM j.lease_expires_at)::float8 AS lease,"
            " j.attempts = a.attempt AND j.status = 'running' AS holds"
            " FROM pgworker.job_attempts a JOIN pgworker.jobs j ON j.id = a.job_id"
            " WHERE a.worker_id = $1 AND a.started_at < to_timestamp($2)"
            " AND (a.finished_at IS NULL OR a.finished_at > to_timestamp($2))",
            victim.name,
            t_cut,
        )

    async def rescued() -> list[asyncpg.Record] | None:
        rows = await victims_attempts()
        for r in rows:
            if r["holds"] and r["lease"] is not None:
                leases[r["job_id"], r["attempt"]] = r["lease"]
        return None if any(r["outcome"] == "running" for r in rows) else rows

    bound = LEASE + min(LEASE / 2, 5) + (LEASE if c.leader else 0) + 5
    try:
        final = await wait_until("its open attempts rescued", rescued, bound, every=0.05)
    except Broken:
        left = [r["job_id"] for r in await victims_attempts() if r["outcome"] == "running"]
        raise Broken(
            f"cut ({label}) of {victim.name}: {len(left)} of its attempts open at the cut were"
            f" not rescued within {bound:.0f} s (lease {LEASE:g} s): jobs {left[:10]}"
        ) from None
    lost = [r for r in final if r["outcome"] == "lost"]
    c.attempts = [(r["job_id"], r["attempt"]) for r in lost]
    c.open_holds = sum(r["type"] == "hold" for r in final)
    c.open_ticks = len(final) - c.open_holds
    if not any(r["type"] == "hold" for r in lost):
        raise Broken(f"cut ({label}) of {victim.name}: none of its long jobs was lost: {final}")
    early = [
        (r["job_id"], r["finished"] - leases[(r["job_id"], r["attempt"])])
        for r in lost
        if r["finished"] < leases.get((r["job_id"], r["attempt"]), 0.0)
    ]
    if early:
        raise Broken(f"cut ({label}): jobs rescued before their lease expired: {early[:5]}")
    c.to_leases_expired = max(leases.values(), default=t_cut) - t_cut
    c.to_rescue = (
        min(r["finished"] for r in lost) - t_cut,
        max(r["finished"] for r in lost) - t_cut,
    )

    # Rescued jobs run again elsewhere.
    ids = [j for j, _ in c.attempts]

    async def rerun() -> float | None:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, extract(epoch FROM max(first))::float8 AS at FROM ("
            " SELECT min(started_at) AS first FROM pgworker.job_attempts"
            " WHERE job_id = ANY($1) AND worker_id <> $2 AND started_at > to_timestamp($3)"
            " GROUP BY job_id) s",
            ids,
            victim.name,
            t_cut,
        )
        return row["at"] if row["n"] == len(set(ids)) else None

    try:
        c.to_rerun = await wait_until("rescued jobs run again", rerun, 20) - t_cut
    except Broken:
        raise Broken(
            f"cut ({label}) of {victim.name}: its rescued jobs did not all start again on the"
            f" other hosts within 20 s of their rescue"
        ) from None

    # The victim's long handlers: when the last of them ended (from its log).
    holds = {(r["job_id"], r["attempt"]) for r in final if r["type"] == "hold"}

    async def stopped() -> dict[tuple[int, int], dict[str, Any]] | None:
        ended = {
            (e["job_id"], e["attempt"]): e
            for e in victim.entries(since)
            if e.get("event") == "scale: hold ended"
        }
        return ended if holds <= ended.keys() else None

    c.stop_how = f"not within {HOLD + 5:.0f} s"
    with contextlib.suppress(Broken):
        ended = await wait_until("the cut host's handlers ended", stopped, HOLD + 5)
        last = max((ended[k] for k in holds), key=_at)
        c.to_stopped = _at(last) - t_cut
        hows = {ended[k]["how"] for k in holds}
        c.stop_how = "cancelled" if hows == {"cancelled"} else "ran to their end"
        c.before_lease = all(_at(ended[k]) < leases.get(k, t_cut + LEASE) for k in holds)
    fence_lines = [e for e in victim.entries(since) if fence and fence in str(e.get("event"))]
    c.fence_logged = len(fence_lines)

    # Heal: the victim serves again.
    t_heal = time.time()
    net.heal(victim, how)

    async def serves() -> float | None:
        """Whether it claimed a job since; the queue is kept supplied meanwhile, since the other
        hosts may empty it before the healed host wakes up."""
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pgworker.jobs WHERE status = 'pending' AND type = 'tick'"
        )
        if waiting < HOSTS * CONCURRENCY:
            await enqueue(conn, "tick", f"{batch}-after", 4 * HOSTS * CONCURRENCY)
        at: float | None = await conn.fetchval(
            "SELECT extract(epoch FROM min(started_at))::float8 FROM pgworker.job_attempts"
            " WHERE worker_id = $1 AND started_at > to_timestamp($2)",
            victim.name,
            t_heal,
        )
        return at

    try:
        c.to_serving = await wait_until("the healed host serving", serves, 90) - t_heal
    except Broken:
        raise Broken(
            f"cut ({label}): {victim.name} claimed no job within 90 s of the heal"
        ) from None
    try:
        await wait_until(
            f"the jobs of cut ({label}) finished", lambda: _none(unfinished(conn)), HOLD + 30
        )
    except Broken as e:
        raise Broken(f"{e}; unfinished: {await unfinished_jobs(conn)}") from None
    c.dropped_logged = sum("outcome dropped" in str(e.get("event")) for e in victim.entries(since))
    if fence is not None:
        if c.to_stopped is None or not c.before_lease:
            raise Broken(
                f"cut ({label}): {victim.name} fences itself ({fence!r}), yet its attempts"
                f" did not stop before their leases expired {c.to_leases_expired:.1f} s after"
                f" the cut: {c.stopped()}"
            )
        if c.fence_logged != 1:
            raise Broken(f"cut ({label}): {fence!r} logged {c.fence_logged} times, not once")


async def reconcile(conn: asyncpg.Connection, cuts: list[Cut]) -> list[tuple[str, Any]]:
    """Every job completed once, its other attempts lost, its result its completed attempt's;
    the cut hosts' rescued attempts still `lost`."""
    jobs = await conn.fetch(
        """SELECT j.id, j.status, j.attempts, (j.result->>'attempt')::int AS result_attempt,
                  array_agg(a.outcome ORDER BY a.attempt) AS outcomes,
                  array_agg(a.attempt ORDER BY a.attempt) FILTER (WHERE a.outcome = 'completed')
                      AS completed
           FROM pgworker.jobs j LEFT JOIN pgworker.job_attempts a ON a.job_id = j.id
           GROUP BY j.id"""
    )
    wrong = []
    twice = 0
    for j in jobs:
        done = j["completed"] or []
        if j["status"] != "completed" or len(done) != 1:
            wrong.append(f"job {j['id']}: {j['status']}, attempts {j['outcomes']}")
        elif any(o != "lost" for o in j["outcomes"] if o != "completed"):
            wrong.append(f"job {j['id']}: a second run unexplained: {j['outcomes']}")
        elif j["result_attempt"] != done[0] or len(j["outcomes"]) != j["attempts"]:
            wrong.append(
                f"job {j['id']}: its result is attempt {j['result_attempt']}'s, its completed"
                f" attempt is {done[0]} (a late outcome written over the rescue?)"
            )
        twice += len(j["outcomes"]) > 1
    for c in cuts:
        outcomes = await conn.fetch(
            "SELECT job_id, attempt, outcome FROM pgworker.job_attempts"
            " WHERE (job_id, attempt) IN (SELECT * FROM unnest($1::bigint[], $2::int[]))",
            [j for j, _ in c.attempts],
            [a for _, a in c.attempts],
        )
        overwritten = [r for r in outcomes if r["outcome"] != "lost"]
        if overwritten:
            wrong.append(f"cut ({c.label}): rescued attempts overwritten: {overwritten[:5]}")
    if wrong:
        raise Broken(
            f"{len(wrong)} jobs did not end as promised:\n    " + "\n    ".join(wrong[:10])
        )
    return [
        ("jobs", len(jobs)),
        ("  completed exactly once", len(jobs)),
        ("  run more than once, each with a lost attempt", twice),
    ]


# The run --------------------------------------------------------------------------------------


async def scenario(dsn: str, net: Network, hosts: list[Host], rows: list[tuple[str, Any]]) -> None:
    deadline = time.monotonic() + 30
    while True:  # the server reloads its rules a moment after pg_ctl reload returns
        try:
            conn = await asyncpg.connect(dsn, timeout=10)
            break
        except (OSError, asyncpg.PostgresError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
    try:
        await pgworker.migrate(conn)
        version = await conn.fetchval("SHOW server_version")
        fence = self_fencing()
        rows.append(("PostgreSQL", f"{version} at {DB_ADDR}:{PORT}, bridge {BRIDGE}"))
        rows.append(("self-fencing in this code", repr(fence) if fence else "no (measured only)"))
        base = 0.0
        for n in (1, 2, 4):
            rate, took = await throughput(conn, hosts[:n], dsn)
            base = base or rate
            shown = f"{rate:.0f} jobs/s ({JOBS * n} jobs in {took:.1f} s, x{rate / base:.2f})"
            rows.append((f"throughput, {n} host{'s' * (n > 1)}", shown))
            if n in SCALING and rate < SCALING[n] * base:
                raise Broken(
                    f"{n} hosts ran {rate:.0f} jobs/s, x{rate / base:.2f} of one host's"
                    f" {base:.0f}; near-linear means at least x{SCALING[n]}"
                )
        cuts = []
        for how in ("down", "drop"):
            label = "link down" if how == "down" else f"silent drop: {net.drop_by}"
            cuts.append(Cut(how, label))
            try:
                await cut(cuts[-1], conn, net, hosts, fence)
            finally:
                rows.extend(cuts[-1].rows())
        for h in hosts:
            if h.stop() != 0:
                raise Broken(f"worker {h.name} exited {h.proc and h.proc.returncode} at SIGTERM")
        rows += await reconcile(conn, cuts)
    finally:
        await conn.close()


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    bindir = pg_bindir()
    data = tempfile.mkdtemp(prefix=f"{PREFIX}-pg-")
    db = devdb.Cluster(data, bindir=bindir, fsync=False, port=PORT, host=DB_ADDR)
    try:
        dsn = db.start()
        db.trust(f"{NET}.0/24")
        yield dsn
    finally:
        db.stop("immediate")
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if os.geteuid() != 0:
        print("scale: skipped: needs root (network namespaces, a bridge, veth pairs); CI runs it")
        return 0
    if not (shutil.which("ip") and shutil.which("tc")):
        print("scale: skipped: needs iproute2 (`ip`, `tc`)")
        return 0
    arm(BUDGET)
    started = time.monotonic()
    left = Network.clean() + clean_clusters()
    if left:
        print(f"scale: removed what an earlier run left: {', '.join(left)}")
    logs = Path(tempfile.mkdtemp(prefix=f"{PREFIX}-logs-"))
    hosts = [Host(n, logs) for n in range(1, HOSTS + 1)]
    net = Network(hosts)
    rows: list[tuple[str, Any]] = []
    failure = ""
    try:
        net.build()
        with cluster() as dsn:
            try:
                asyncio.run(scenario(dsn, net, hosts, rows))
            finally:
                for h in hosts:
                    h.kill()
    except Skip as exc:
        print(f"scale: skipped: {exc}")
        return 0
    except Exception as exc:  # Broken, Stopped, or the harness's own trouble: the table so far
        failure = ended(exc)
    finally:
        disarm()
        Network.clean()
    took = time.monotonic() - started
    print(
        f"\nscale: {HOSTS} hosts (network namespaces on a bridge), handlers of {TICK_S * 1000:.0f}"
        f" ms, lease {LEASE:g} s, concurrency {CONCURRENCY}; worker logs in {logs}"
    )
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    print(f"  {'took'.ljust(width)}  {took:.0f} s")
    if failure:
        print(f"FAILED: {failure}")
        return 1
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
