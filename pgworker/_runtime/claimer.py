"""The claim: given how many jobs a worker has room for, which statements claim them, and the
rows they return. The producer asks; this module alone knows the statements.

One claim runs at most two statements, in this order:

- the limited claim (fleet_limits.py: job_claim_limited.sql for each limited (queue, type,
  version), under the advisory locks of the limits), for the free slots only: limits count
  claimed jobs as running, so none is claimed ahead;
- the plain claim, for the rest of the room: job_claim.sql when the (queue, type, version)
  served are at most the claim's limit, each read on its own; job_claim_wide.sql when they
  outnumber it, which first picks those whose first jobs come first (claim_statement).

Both share their end (the jobs made running, their attempt rows, the rows returned) as SQL
fragments, so that every claim writes a job the same way. Through a transaction pooler each
statement runs as the schema's pooled function of its text when there is one
(Queries.pooled_functions), planned once per server session."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from .._db.connection import Conn, SharedConnection
from .._db.queries import Queries, Row, attempt_conflict, claim_statement
from ..registry import Registry, served_key
from ..settings import Settings
from .fleet_limits import LimitedClaims

T = TypeVar("T")

AHEAD_MOST = 4
"""The most jobs claimed ahead, in multiples of the concurrency."""
AVERAGE_WEIGHT = 0.1
"""The weight of the newest figure in the running averages of run time and claim time."""


class ClaimAhead:
    """How many jobs of each type to claim beyond the free slots, so that the next claim runs
    while the slots still work rather than after them, and claims are larger: as many as the
    slots end during one claim's round trip (AHEAD_MOST times the concurrency at most), judged
    by the type's own run times, and none of a type whose handlers take longer than that, or
    that has not run here yet. Only jobs of types that end faster than a claim wait in the
    worker, each about one claim's time at most."""

    def __init__(self, concurrency: int) -> None:
        self._concurrency = concurrency
        self._run: dict[str, float] = {}
        self._claim: float | None = None
        self.jobs = 0
        """The most jobs of any type claimed ahead."""

    def ran(self, type_: str, seconds: float) -> None:
        run = self._run.get(type_)
        self._run[type_] = seconds if run is None else run + AVERAGE_WEIGHT * (seconds - run)

    def claimed(self, seconds: float) -> None:
        claim = self._claim
        self._claim = seconds if claim is None else claim + AVERAGE_WEIGHT * (seconds - claim)
        self.jobs = max(map(self.of, self._run), default=0)

    def of(self, type_: str) -> int:
        run = self._run.get(type_)
        if run is None or self._claim is None:
            return 0
        most = self._concurrency * AHEAD_MOST
        if run * most <= self._claim * self._concurrency:
            return most
        return int(self._concurrency * self._claim / run)


@dataclass(slots=True)
class Claimed:
    """What one claim took."""

    rows: list[Row] = field(default_factory=list)
    """The jobs claimed, each already handed to the slots (`start`) as its statement returned."""
    saturated: bool = False
    """Whether it took all the room, or all it could of a type: another claim may find more."""
    wait: float | None = None
    """Seconds until a full rate window allows a start (None: no rate held the claim back)."""
    again: bool = False
    """Whether to claim again at once: a job's attempt counter was repaired."""


class Claimer:
    """One worker's claims (see the module's docstring)."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        queries: Queries,
        shared: SharedConnection,
        log: Any,
        start: Callable[[list[Row]], object],
    ) -> None:
        self._settings = settings
        self._q = queries
        self._shared = shared
        self._log = log
        self._start = start
        self.limited = LimitedClaims(registry, settings, queries)
        self.ahead = ClaimAhead(settings.concurrency)
        self._types = [t.name for t in registry]
        self._default_max_retries = [t.retry.max_retries for t in registry]
        # The (type, payload version) pairs of the plain claim: version 1 by type name, the
        # others (none unless a task declares a version or upgraders) as `type@version`.
        # Tasks with limits are claimed apart.
        plain = [(t, v) for t, v in registry.served() if t not in self.limited.limited_types]
        self._version_1_types = [t for t, v in plain if v == 1]
        self._other_versions = [served_key(t, v) for t, v in plain if v != 1]
        self._pairs = len(settings.served_queues) * len(plain)

    def room(self, free: int) -> int:
        """How many jobs the next claim asks for, with `free` slots (fewer than none while jobs
        claimed ahead wait for a slot): the free slots plus the jobs claimed ahead (ClaimAhead);
        0 while claimed jobs still cover the next claim's round trip."""
        ahead = self.ahead.jobs
        room = free + ahead
        return room if room >= max(ahead, 1) else 0

    def limits_changed(self) -> None:
        """The queues' limits may have changed (a poll, a queue's bare notification): the next
        claim reads them again."""
        self.limited.stale = True

    async def claim(self, conn: Conn, free: int) -> Claimed:
        """Claim as many jobs as the worker has room for with `free` slots (`room`): limited
        jobs first, for the free slots (the plain claim would otherwise take every free slot for
        as long as plain work waits), then plain jobs for the rest."""
        room = self.room(free)
        claimed = Claimed()
        if room <= 0:
            return claimed
        if free > 0 and self.limited.wanted():
            rows, claimed.wait = await self._repairing(
                claimed, self.limited.claim(conn, free), ([], None)
            )
            self._took(claimed, rows)
        taken = len(claimed.rows)
        if taken < room and (self._version_1_types or self._other_versions):
            claimed.saturated = await self._plain(conn, claimed, room - taken, max(free - taken, 0))
        claimed.saturated = claimed.saturated or len(claimed.rows) == room
        return claimed

    async def _plain(self, conn: Conn, claimed: Claimed, limit: int, free: int) -> bool:
        """The plain claim of up to `limit` jobs, `free` slots of them still free; whether a
        type got all it could (its jobs claimed ahead are capped), and so may have more."""
        s = self._settings
        # Each type's most, fixed for this claim: the averages move once it returns.
        caps = {t: free + self.ahead.of(t) for t in self._types}
        began = time.monotonic()
        rows = await self._repairing(
            claimed,
            self._q.job_claim(
                conn,
                queues=s.served_queues,
                types=self._types,
                default_max_retries=self._default_max_retries,
                limit=limit,
                worker_id=s.worker_id,
                lease=s.lease,
                code_version=s.code_version,
                durable=s.durable_claims,
                version_1_types=self._version_1_types,
                other_versions=self._other_versions,
                most=caps.__getitem__,
                wide=claim_statement(self._pairs, limit) == "job_claim_wide",
            ),
            [],
        )
        self.ahead.claimed(time.monotonic() - began)
        self._took(claimed, rows)
        return any(n >= caps[t] for t, n in Counter(r["type"] for r in rows).items())

    def _took(self, claimed: Claimed, rows: list[Row]) -> None:
        """Hand a statement's jobs to the slots as soon as it returns."""
        if rows:
            self._start(rows)
            claimed.rows += rows

    async def _repairing(self, claimed: Claimed, claim: Awaitable[T], empty: T) -> T:
        """The statement's result; `empty` when a job's attempt number was taken (its
        `attempts` was reset by hand), which is repaired for the next claim."""
        try:
            return await claim
        except asyncpg.exceptions.UniqueViolationError as exc:
            job_id = attempt_conflict(exc)
            if job_id is None:
                raise
            self._log.warning(
                "a job's attempts counter was behind its attempt rows (reset by hand): "
                "its next attempt is numbered after the last",
                job_id=job_id,
            )
            await self._q.job_attempts_repair(self._shared, job_id)
            claimed.again = True
            return empty
