"""The claim of limited jobs: the tasks that declare `max_running`, `max_running_per_key` or
`rate_limit`, and every task of a queue given a limit by `pgworker queue limit`. The plain
claims (job_claim.sql, job_claim_wide.sql) leave them out; here each limit is counted from the
jobs table under a transaction-scoped advisory lock of the limit (sql/queries/limits_lock.sql,
job_claim_limited.sql), so that at no moment do the claims of all workers together exceed it,
and no lock outlives a claim. The Claimer (claimer.py) runs this claim before the plain one.

A worker that a limit holds back does not claim again until something can have changed: a job
of a limit it serves ended (once its outcome is written, the worker whose job it was claims
again, and passes on what it cannot take with a notification of new jobs, jobs_announce.sql,
which wakes the next workers in turn), a rate window frees a start (the claim says when), or its
poll comes."""

from __future__ import annotations

from collections.abc import Sequence

from .._db.connection import Conn
from .._db.queries import Queries, Row, transaction
from .._task import Task
from ..models import AttemptResult
from ..registry import Registry
from ..settings import Settings


class LimitedClaims:
    """What one worker claims under limits, and which of its jobs free a limit when they end."""

    def __init__(self, registry: Registry, settings: Settings, queries: Queries) -> None:
        self._q = queries
        self._settings = settings
        self._tasks = {t.name: t for t in registry}
        self._served = registry.served()
        self._limited_types = sorted(t.name for t in registry if t.limited)
        self.queues: dict[str, Row] = {}
        """The worker's queues that have limits, as the last claim read them."""
        self._held: dict[int, tuple[str, str]] = {}
        self.stale = True
        """Whether the queues' limits must be read again (a poll, a queue's bare notification)."""

    @property
    def limited_types(self) -> frozenset[str]:
        """The task types the plain claim leaves out."""
        return frozenset(self._limited_types)

    def wanted(self) -> bool:
        """Whether the next claim step runs a limited claim."""
        return bool(self._limited_types or self.queues or self.stale)

    def _groups(self) -> list[tuple[str, Task, int]]:
        groups = []
        for queue in self._settings.served_queues:
            for name, version in self._served:
                task = self._tasks[name]
                if queue in self.queues or task.limited:
                    groups.append((queue, task, version))
        return groups

    async def claim(self, conn: Conn, free: int) -> tuple[list[Row], float | None]:
        """Claim up to `free` limited jobs in one transaction; the rows, and the seconds until a
        full rate window allows a start (None: no rate held the claim back)."""
        s = self._settings
        claimed: list[Row] = []
        wait = None
        if not self._limited_types and not self.queues:
            # Only looking for queue limits (a poll): without any, the statement takes no lock,
            # and needs no transaction of its own.
            self.stale = False
            if not await self._q.limits_lock(conn, s.served_queues, ()):
                return claimed, wait
        async with transaction(conn) as tx:
            rows = await self._q.limits_lock(tx, s.served_queues, self._limited_types)
            self.queues = {r["name"]: r for r in rows}
            self.stale = False
            for queue, task, version in self._groups():
                if len(claimed) >= free:
                    break
                claimed += await self._q.job_claim_limited(
                    tx,
                    queue=queue,
                    type=task.name,
                    version=version,
                    limit=free - len(claimed),
                    worker_id=s.worker_id,
                    lease=s.lease,
                    max_retries=task.retry.max_retries,
                    code_version=s.code_version,
                    durable=s.durable_claims,
                    max_running=task.max_running,
                    max_running_per_key=task.max_running_per_key,
                    rate=task.rate_limit,
                    queue_locked=queue in self.queues,
                )
            rates = self._rates()
            if len(claimed) < free and rates:
                wait = await self._q.rate_next(tx, rates)
        for record in claimed:
            self._held[record["id"]] = (record["queue"], record["type"])
        return claimed, wait

    def _rates(self) -> list[tuple[str, int, int]]:
        rates = [
            (f"queue:{r['name']}", r["rate_limit"], r["rate_period"])
            for r in self.queues.values()
            if r["rate_limit"] is not None
        ]
        for name in self._limited_types:
            rate = self._tasks[name].rate_limit
            if rate is not None:
                rates.append((f"type:{name}", rate.starts, rate.period))
        return rates

    def forget(self, job_id: int) -> None:
        """The job's outcome will not be written here (its attempt was fenced): the rescue frees
        its room."""
        self._held.pop(job_id, None)

    def freed(self, batch: Sequence[AttemptResult]) -> list[tuple[int, str, str]]:
        """(job id, queue, type) of the jobs of this written batch that were claimed under a
        limit: their room in the limits is free again. Nothing to look up (a worker without
        limited work) costs nothing per job."""
        if not self._held:
            return []
        ends = []
        for result in batch:
            held = self._held.pop(result.job_id, None)
            if held is not None:
                ends.append((result.job_id, *held))
        return ends
