"""The one place that runs pgworker's SQL: a `Queries` bound to a schema has one method per file
of `sql/queries`, named after it, and every statement pgworker sends goes through one of them.
Rows leave as mappings read by column name; callers never see how a statement is written."""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Mapping,
    Sequence,
)
from datetime import UTC, datetime
from functools import cache
from typing import Any, NamedTuple

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from .. import _validate as validate
from ..models import DEFAULT_SCHEMA, AttemptResult
from . import files
from .connection import (
    Conn,
    Runner,
    SharedConnection,
    privilege_error,
    schema_errors,
    through_pooler,
)

Row = asyncpg.Record
"""A row, read by column name."""

AttemptKey = tuple[int, int, datetime]
"""(job id, attempt number, claimed at): what fences every write about an attempt."""

POOLED = (
    "job_claim",
    "job_claim_wide",
    "job_finish_many",
    "worker_heartbeat",
    "limits_lock",
    "job_claim_limited",
)
"""The worker's statements that, through a transaction pooler, run as functions of the schema
(see `Queries.pooled_functions`)."""

_BEGINNING = datetime(1, 1, 1, tzinfo=UTC)
_ATTEMPT_KEY = re.compile(r"\(job_id, attempt\)=\((\d+), \d+\)")


def attempt_conflict(exc: BaseException) -> int | None:
    """The job whose claim found its attempt number taken (its `attempts` was reset by hand)."""
    if not isinstance(exc, asyncpg.exceptions.UniqueViolationError):
        return None
    found = _ATTEMPT_KEY.search(getattr(exc, "detail", None) or "")
    return int(found.group(1)) if found else None


def _with_database(sql: str, database: str) -> str:
    """`sql` with its `{database}` placeholder set to `database`, checked as a plain identifier."""
    return sql.replace("{database}", f'"{validate.identifier("database", database)}"')


class Beat(NamedTuple):
    """What a heartbeat found of one attempt that still holds its job."""

    cancel_requested: bool
    extended: bool


_PARAMETER = re.compile(r"\$(\d+)\b")


def _pooled_name(name: str, sql: str) -> str:
    """Named after the statement's text and the schema's version, whose columns its result
    types are read from."""
    digest = hashlib.sha256(f"{files.latest_version()}\n{sql}".encode()).hexdigest()[:12]
    return f"_pooled_{name}_{digest}"


def _attempt_arrays(attempts: Sequence[AttemptKey]) -> list[list[Any]]:
    return [
        [job_id for job_id, _, _ in attempts],
        [attempt for _, attempt, _ in attempts],
        [claimed_at for _, _, claimed_at in attempts],
    ]


@contextlib.asynccontextmanager
async def savepointed(conn: Conn) -> AsyncIterator[Conn]:
    """A savepoint in the caller's own transaction (see `transaction`): released when
    the block ends, rolled back to when it raises."""
    q = queries(DEFAULT_SCHEMA)  # these statements name no schema
    await q.savepoint(conn)
    try:
        yield conn
    except BaseException:
        with contextlib.suppress(Exception):  # the connection may be gone: the error says why
            await q.savepoint_rollback(conn)
        raise
    await q.savepoint_release(conn)


@contextlib.asynccontextmanager
async def transaction(conn: Runner) -> AsyncIterator[Conn]:
    """A transaction on `conn` (a savepoint inside the caller's), or on a connection of a pool.
    In a transaction the caller began with a raw `BEGIN`, which asyncpg does not know of and
    refuses to nest in (InterfaceError), a savepoint of pgworker's own: what runs in the block
    is still undone together when it fails, and kept only if the caller's transaction commits."""
    if isinstance(conn, asyncpg.Pool | SharedConnection):
        async with conn.acquire() as c, c.transaction():
            yield c
    elif (
        isinstance(conn, asyncpg.Connection | PoolConnectionProxy)
        and conn.is_in_transaction()
        and getattr(conn, "_top_xact", None) is None
    ):
        async with savepointed(conn):
            yield conn
    else:
        async with conn.transaction():
            yield conn


def claim_statement(pairs: int, limit: int) -> str:
    """The claim for a worker that serves `pairs` (queue, type, version) and claims up to
    `limit` jobs: job_claim.sql reads each pair; job_claim_wide.sql, when they outnumber the
    limit, first picks the `limit` pairs whose first jobs come first. One statement per case
    rather than both in one: the common one plans and runs a third fewer nodes."""
    return "job_claim" if pairs <= limit else "job_claim_wide"


@cache
def queries(schema: str) -> Queries:
    """The queries of `schema`, made once per schema."""
    return Queries(schema)


class Queries:
    """pgworker's statements for one schema. Each method takes the connection (or pool) to run
    on as its first argument: the caller chooses where, this object says what."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.jobs_channel = files.jobs_channel(schema)
        self.cancel_channel = files.cancel_channel(schema)
        self.ended_channel = files.ended_channel(schema)
        self._sql = files.queries(schema)
        self._pooled: dict[str, str] = {}
        """The call of each pooled function known to be in the schema, by statement."""

    async def _rows(self, conn: Runner, name: str, *args: Any) -> list[Row]:
        """The rows of statement `name`, a missing schema said as SchemaError."""
        with schema_errors(self.schema):
            return await conn.fetch(self._sql[name], *args)

    async def _worker_rows(self, conn: Runner, name: str, *args: Any) -> list[Row]:
        """The rows of a statement of the worker's (POOLED): through a transaction pooler, from its
        pooled function when the schema has it (`pooled_functions`)."""
        call = self._pooled.get(name)
        if call is None or not through_pooler(conn):
            return await conn.fetch(self._sql[name], *args)
        alone = not getattr(conn, "is_in_transaction", bool)()
        try:
            return await conn.call_pooled(call, *args)  # type: ignore[union-attr,no-any-return]
        except (
            asyncpg.exceptions.UndefinedFunctionError,
            asyncpg.exceptions.InsufficientPrivilegeError,
        ):
            # Gone since (the schema made again), or no longer ours to execute: the plain
            # statement, until a worker starts; in a transaction, which the error ended, from
            # the caller's next one.
            self._pooled.pop(name, None)
            if not alone:
                raise
            return await conn.fetch(self._sql[name], *args)

    async def pooled_functions(self, conn: Runner) -> list[str]:
        """Make, in the schema, the functions that run the worker's statements (POOLED) through a
        transaction pooler: there no statement stays prepared, so each would be parsed and
        planned at every execution (about 1 ms for a claim); a PL/pgSQL function keeps its plan
        for as long as its server session lives. Each is named after its statement and a digest
        of its text: every release calls its own, and a rolling upgrade's older workers keep
        theirs. Returns the names of those the role cannot call: missing and not made (the role
        may not create in the schema), or made and not executable by the role (EXECUTE revoked
        from PUBLIC). Their statements stay plain."""
        wanted = self._pooled_names()
        failed = []
        async with transaction(conn) as c:
            # Waits for any session making them or migrating; what is missing is read after.
            await self.migrations_lock_xact(c)
            missing = await c.fetch(self._sql["pooled_functions"], list(wanted))
            for function, made in missing:
                if made:
                    failed.append(function)
                    continue
                try:
                    async with savepointed(c):
                        await c.execute(await self.pooled_function(c, function, wanted[function]))
                except asyncpg.exceptions.InsufficientPrivilegeError:
                    failed.append(function)
        for function, name in wanted.items():
            if function not in failed:
                params = max(map(int, _PARAMETER.findall(self._sql[name])))
                arguments = ", ".join(f"${i}" for i in range(1, params + 2))
                self._pooled[name] = f'SELECT * FROM "{self.schema}".{function}({arguments})'
        return failed

    def _pooled_names(self) -> dict[str, str]:
        """This release's pooled functions: each statement of POOLED, by function name."""
        return {_pooled_name(name, self._sql[name]): name for name in POOLED}

    async def pooled_functions_unused(self, conn: Conn) -> list[Row]:
        """The pooled functions no one may call any more: neither this release's nor any a
        registered worker says it calls (name, signature)."""
        return await conn.fetch(self._sql["pooled_functions_unused"], list(self._pooled_names()))

    async def pooled_function_drop(self, conn: Conn, signature: str) -> None:
        """Drop one pooled function, `signature` as pooled_functions_unused.sql gives it."""
        await conn.execute(self._sql["pooled_function_drop"].replace("{signature}", signature))

    async def pooled_function(self, conn: Conn, function: str, name: str) -> str:
        """The CREATE FUNCTION of statement `name`'s pooled function `function` (pooled_function.sql
        is its template), its types read off the statement."""
        statement = await conn.prepare(self._sql[name])
        parameters = await self.type_names(conn, [t.oid for t in statement.get_parameters()])
        attributes = statement.get_attributes()
        types = await self.type_names(conn, [a.type.oid for a in attributes])
        columns = ", ".join(f'"{a.name}" {t}' for a, t in zip(attributes, types, strict=True))
        return (
            self._sql["pooled_function"]
            .replace("{statement}", name)
            .replace("{function}", function)
            .replace("{parameters}", ", ".join(parameters))
            .replace("{columns}", columns)
            .replace("{timeout}", str(len(parameters) + 1))
            .replace("{body}", self._sql[name])
        )

    async def type_names(self, conn: Conn, oids: list[int]) -> list[str]:
        """The SQL names of the types `oids`, in their order."""
        return [r["name"] for r in await conn.fetch(self._sql["type_names"], oids)]

    # --- enqueue ---------------------------------------------------------------------------

    async def job_insert(self, conn: Runner, *args: Any) -> Row | None:
        with schema_errors(self.schema):
            return await conn.fetchrow(self._sql["job_insert"], *args)

    async def job_insert_unique(self, conn: Runner, *args: Any) -> Row | None:
        """One job with a unique key (see job_insert_unique.sql): the new job, or the one
        holding the key, with `created`; None when the statement must run again."""
        with schema_errors(self.schema):
            return await conn.fetchrow(self._sql["job_insert_unique"], *args)

    async def job_unique_replace(
        self,
        conn: Runner,
        job_id: int,
        payload: str,
        priority: int,
        run_at: Any,
        delay: float | None,
    ) -> Row | None:
        """The pending job `job_id` with this payload, priority and run_at; None when it is no
        longer pending."""
        with schema_errors(self.schema):
            return await conn.fetchrow(
                self._sql["job_unique_replace"], job_id, payload, priority, run_at, delay
            )

    async def job_update(
        self,
        conn: Runner,
        job_id: int,
        run_at: Any,
        priority: int | None,
        payload: str | None,
        actor: str,
    ) -> Row | None:
        """Change a pending job (see job_update.sql); None when there is no such job."""
        with schema_errors(self.schema):
            return await conn.fetchrow(
                self._sql["job_update"], job_id, run_at, priority, payload, actor
            )

    async def job_insert_many(
        self, conn: Conn, batch: str, traceparent: str | None = None
    ) -> list[Row]:
        """Insert the jobs of `batch`, a JSON array (see job_insert_many.sql), each with
        `traceparent`."""
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["job_insert_many"], batch, traceparent)

    async def job_parents_lock(self, conn: Conn, parents: Sequence[int]) -> dict[int, str]:
        """Mark the jobs `parents` (ids in ascending order) as having dependants, their rows
        locked until the transaction ends; the latest status of each found."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["job_parents_lock"], list(parents))
        return {r["id"]: r["status"] for r in rows}

    async def job_insert_after(self, conn: Conn, *args: Any) -> Row | None:
        """job_insert's arguments, then the parents, how many have not ended, on_parent_failure
        and the error of a job cancelled at once (see job_insert_after.sql)."""
        with schema_errors(self.schema):
            return await conn.fetchrow(self._sql["job_insert_after"], *args)

    async def job_parents_of(self, conn: Runner, parents: Sequence[int]) -> list[Row]:
        """The parents of a job that still exist, whole, in id order."""
        return await self._rows(conn, "job_parents_of", list(parents))

    async def job_ids_reserve(self, conn: Conn, n: int) -> tuple[list[str], Any]:
        """`n` new job ids for a batch that COPY writes, as the text that COPY sends, and the
        transaction's time."""
        with schema_errors(self.schema):
            reserved = await conn.fetchrow(self._sql["job_ids_reserve"], n)
        assert reserved is not None  # one row, always
        return reserved["ids"].split(","), reserved["now"]

    async def jobs_copy(self, conn: Conn, columns: list[str], chunks: AsyncIterable[bytes]) -> None:
        """Write rows into `jobs` with COPY (text format), the fastest path in; each chunk is
        sent as soon as it is made. COPY has no .sql file: asyncpg speaks its protocol."""
        with schema_errors(self.schema):
            await conn.copy_to_table(
                "jobs", schema_name=self.schema, columns=columns, source=chunks, format="text"
            )

    async def job_get_by_keys(
        self,
        conn: Runner,
        keys: Sequence[str],
        types: Sequence[str],
        payloads: Sequence[str],
    ) -> dict[str, Row]:
        """The jobs holding `keys`, keyed by key, each with `matches`: created with that type
        and payload or not."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["job_get_by_keys"], keys, types, payloads)
        return {r["requested_key"]: r for r in rows}

    async def job_get(self, conn: Runner, job_id: int) -> Row | None:
        with schema_errors(self.schema):
            return await conn.fetchrow(self._sql["job_get"], job_id)

    # --- awaiting jobs (_waits.py) -------------------------------------------------------------

    async def jobs_await_mark(self, conn: Conn, job_ids: Sequence[int]) -> list[int]:
        """Mark the jobs awaited: their end is announced on `ended_channel` from now on. Returns
        the ids of those skipped because another transaction holds their row locked."""
        rows = await self._rows(conn, "jobs_await_mark", list(job_ids))
        return [row["id"] for row in rows]

    async def jobs_awaited(self, conn: Conn, job_ids: Sequence[int]) -> list[Row]:
        """One row per id: `wanted`, `current` (its status, None when there is no such job) and
        the job's columns once it ended."""
        return await self._rows(conn, "jobs_awaited", list(job_ids))

    async def notify(self, conn: Runner, channel: str, payload: str) -> None:
        await conn.execute(self._sql["notify"], channel, payload)

    async def jobs_announce(self, conn: Runner, jobs: Sequence[tuple[int, str, str]]) -> None:
        """Announce these (id, queue, type) jobs as new ones: one notification of new jobs per
        queue (jobs_announce.sql)."""
        await conn.execute(
            self._sql["jobs_announce"],
            [j for j, _, _ in jobs],
            [q for _, q, _ in jobs],
            [t for _, _, t in jobs],
        )

    async def jobs_pass(
        self,
        conn: Runner,
        queue: str,
        first: int,
        count: int,
        first_type: str | None,
        last_type: str | None,
        hops: int,
    ) -> None:
        """Send a notification of new jobs again, for the workers from position `first` on
        (jobs_pass.sql)."""
        await conn.execute(self._sql["jobs_pass"], queue, first, count, first_type, last_type, hops)

    # --- claim, outcomes, heartbeat ----------------------------------------------------------

    async def job_claim(
        self,
        conn: Runner,
        *,
        queues: Sequence[str],
        types: Sequence[str],
        default_max_retries: Sequence[int],
        limit: int,
        worker_id: str,
        lease: float,
        code_version: str | None,
        durable: bool = False,
        version_1_types: Sequence[str] | None = None,
        other_versions: Sequence[str] = (),
        limited_queues: bool = False,
        most: Callable[[str], int] | None = None,
        wide: bool | None = None,
    ) -> list[Row]:
        """Claim up to `limit` jobs in one statement; the rows are whole jobs. Unless `durable`,
        the claim commits without waiting for its WAL flush. Only jobs of the (type, version)
        pairs served are claimed: version 1 of `version_1_types` (None: of every type) and
        `other_versions`, as registry.served_key writes them; `most(type)` jobs of a type at
        most (None: `limit`). Queues with a limit are left out (job_claim_limited.sql claims
        them) unless `limited_queues`. The statement is job_claim_wide.sql with `wide`, and
        when `wide` is None and the (queue, type, version) served outnumber `limit`."""
        served = [(t, 1) for t in (types if version_1_types is None else version_1_types)]
        for key in other_versions:
            # served_key writes the version after the type's last `@`.
            name, _, version = key.rpartition("@")
            served.append((name, int(version)))
        if wide is None:
            statement = claim_statement(len(queues) * len(served), limit)
        else:
            statement = "job_claim_wide" if wide else "job_claim"
        return await self._worker_rows(
            conn,
            statement,
            queues,
            types,
            limit,
            worker_id,
            lease,
            default_max_retries,
            code_version,
            None if durable else "off",
            [t for t, _ in served],
            [v for _, v in served],
            limited_queues,
            None if most is None else [most(t) for t, _ in served],
        )

    async def job_claim_wide(self, conn: Runner, **claim: Any) -> list[Row]:
        """`job_claim` by job_claim_wide.sql whatever the counts (the same arguments): first the
        `limit` (queue, type, version) whose first due jobs come first, then their jobs."""
        return await self.job_claim(conn, wide=True, **claim)

    async def limits_lock(
        self, conn: Runner, queues: Sequence[str], types: Sequence[str]
    ) -> list[Row]:
        """In the caller's transaction, lock the limits of these queues (those that have any)
        and task types; the queues' limits: name, max_running, rate_limit, rate_period."""
        return await self._worker_rows(conn, "limits_lock", list(queues), list(types))

    async def job_claim_limited(
        self,
        conn: Runner,
        *,
        queue: str,
        type: str,
        version: int,
        limit: int,
        worker_id: str,
        lease: float,
        max_retries: int,
        code_version: str | None,
        durable: bool,
        max_running: int | None,
        max_running_per_key: int | None,
        rate: tuple[int, int] | None,
        queue_locked: bool,
    ) -> list[Row]:
        """Claim up to `limit` jobs of one (queue, type, version) within its limits, after
        `limits_lock` in the same transaction; the rows are whole jobs. `queue_locked`: whether
        limits_lock returned the queue (a queue limited since is left out)."""
        return await self._worker_rows(
            conn,
            "job_claim_limited",
            queue,
            type,
            version,
            limit,
            worker_id,
            lease,
            max_retries,
            code_version,
            None if durable else "off",
            max_running,
            max_running_per_key,
            None if rate is None else rate[0],
            None if rate is None else rate[1],
            queue_locked,
        )

    async def rate_next(self, conn: Runner, rates: Sequence[tuple[str, int, int]]) -> float | None:
        """Seconds until the first of these full rate limits (name, count, period) allows a
        start; None when none is full."""
        wait: float | None = await conn.fetchval(
            self._sql["rate_next"],
            [n for n, _, _ in rates],
            [c for _, c, _ in rates],
            [p for _, _, p in rates],
        )
        return wait

    async def job_attempts_repair(self, conn: Runner, job_id: int) -> None:
        """Number the job's next attempt after its last recorded one."""
        await conn.execute(self._sql["job_attempts_repair"], job_id)

    async def job_finish_many(
        self, conn: Runner, results: Sequence[AttemptResult]
    ) -> dict[int, str]:
        """Write outcomes in one statement; returns the job ids written (the others were
        fenced), each with the outcome its attempt row got (`cancelled` for one that did not
        complete a job whose cancellation was asked for)."""
        rows = await self._worker_rows(
            conn,
            "job_finish_many",
            [r.job_id for r in results],
            [r.attempt for r in results],
            [r.status.value for r in results],
            [r.outcome.value for r in results],
            [r.result for r in results],
            [r.error_type for r in results],
            [r.error_message for r in results],
            [r.delay for r in results],
            [r.retried for r in results],
            [r.claimed_at for r in results],
            [r.error_detail for r in results],
            [r.run_ms for r in results],
        )
        return {r["id"]: r["outcome"] for r in rows}

    async def attempt_outcomes(
        self, conn: Runner, attempts: Sequence[AttemptKey]
    ) -> dict[int, str]:
        """The recorded outcome of these attempts, by job id."""
        rows = await conn.fetch(self._sql["attempt_outcomes"], *_attempt_arrays(attempts))
        return {r["job_id"]: r["outcome"] for r in rows}

    async def worker_register(
        self,
        conn: Runner,
        worker_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        types: Sequence[str],
        concurrency: int,
        lease: float | None = None,
    ) -> None:
        """Register the worker, with the pooled functions it calls: this release's through a
        pooler (whether made or not), none on a direct connection; `migrate` keeps them."""
        await conn.execute(
            self._sql["worker_register"],
            worker_id,
            hostname,
            pid,
            list(queues),
            list(types),
            concurrency,
            lease,
            list(self._pooled_names()) if through_pooler(conn) else [],
        )

    async def workers_live(self, conn: Runner, seen_within: float) -> list[Row]:
        """(worker_id, queues, types) of the workers seen within `seen_within` seconds."""
        return await self._rows(conn, "workers_live", seen_within)

    async def worker_heartbeat(
        self, conn: Runner, running: Sequence[AttemptKey], lease: float
    ) -> dict[tuple[int, int], Beat]:
        """Extend the leases of `running` attempts in one statement. Returns the (job id,
        attempt) still held, each with whether an operator asked to cancel it and whether its
        lease was extended (not when another session holds its row locked)."""
        rows = await self._worker_rows(conn, "worker_heartbeat", *_attempt_arrays(running), lease)
        return {(r["id"], r["attempts"]): Beat(r["cancel_requested"], r["extended"]) for r in rows}

    async def worker_unregister(self, conn: Runner, worker_id: str) -> None:
        await conn.execute(self._sql["worker_unregister"], worker_id)

    # --- what the leader does ----------------------------------------------------------------

    async def leader_take(self, conn: Runner, worker_id: str, lease: float) -> bool:
        """Take the maintenance leadership, or renew it, for `lease` seconds: a lease row, taken
        only when free or expired, so that a leader that freezes loses it when its lease runs
        out."""
        return await conn.fetchval(self._sql["leader_take"], worker_id, lease) is not None

    async def leader_release(self, conn: Runner, worker_id: str) -> None:
        """Give the leadership up (a stopping worker), so that another worker takes it at once."""
        await conn.execute(self._sql["leader_release"], worker_id)

    async def jobs_expired(
        self, conn: Runner, skip: Sequence[int] = (), after: tuple[datetime, int] | None = None
    ) -> list[Row]:
        """Jobs whose lease expired, but those in `skip`, oldest lease first from after `after`
        (a job's lease_expires_at and id; None: from the first)."""
        lease, job_id = after or (_BEGINNING, 0)
        return await conn.fetch(self._sql["jobs_expired"], list(skip), lease, job_id)

    async def jobs_rescue(
        self,
        conn: Runner,
        worker_id: str,
        decided: Sequence[tuple[AttemptKey, str, float, int]],
    ) -> list[Row]:
        """Apply the leader's decisions ((attempt, next status, delay, retried) per expired job)
        if `worker_id` still leads; returns the jobs written with their new status."""
        keys = [d[0] for d in decided]
        return await conn.fetch(
            self._sql["jobs_rescue"],
            *_attempt_arrays(keys),
            [d[1] for d in decided],
            [d[2] for d in decided],
            [d[3] for d in decided],
            worker_id,
        )

    # --- periodic schedules (pgworker/_maintenance/periodic.py) ------------------------------

    async def periodic_lease(
        self, conn: Runner, worker_id: str, lease: float, name: str
    ) -> datetime | None:
        """Take or renew the lease `name` of a schedule set for `lease` seconds; the database's
        clock when `worker_id` holds it, else None."""
        now: datetime | None = await conn.fetchval(
            self._sql["periodic_lease"], worker_id, lease, name
        )
        return now

    async def periodic_release(self, conn: Runner, worker_id: str, name: str) -> None:
        await conn.execute(self._sql["periodic_release"], worker_id, name)

    async def periodic_sync(
        self,
        conn: Runner,
        worker_id: str,
        lease: str,
        schedules: Sequence[tuple[str, str, str, datetime]],
    ) -> list[Row]:
        """Make sure each (name, task, definition, first slot) has its row, fenced by `lease`;
        (name, schedule, next_slot) of each, none when `worker_id` does not hold the lease."""
        return await conn.fetch(
            self._sql["periodic_sync"],
            worker_id,
            lease,
            *(list(column) for column in zip(*schedules, strict=True)),
        )

    async def periodic_enqueue(
        self,
        conn: Runner,
        worker_id: str,
        lease: str,
        jobs: Sequence[tuple[str, str, str, int, str, datetime, str, int]],
        rows: Sequence[tuple[str, str, str, datetime, datetime | None, str | None]],
    ) -> tuple[bool, list[str]]:
        """Insert the due slots' jobs (name, type, queue, priority, payload, slot, key, version)
        and move the schedules' rows (name, type, definition, next slot, last slot, last key),
        fenced by `lease`: whether `worker_id` still held it, and the keys of the jobs created."""
        job_columns = [list(c) for c in zip(*jobs, strict=True)] or [[] for _ in range(8)]
        row_columns = [list(c) for c in zip(*rows, strict=True)] or [[] for _ in range(6)]
        found = await conn.fetchrow(
            self._sql["periodic_enqueue"], worker_id, lease, *job_columns, *row_columns
        )
        assert found is not None  # one row, always
        return bool(found["leading"]), list(found["created"])

    async def periodic_list(self, conn: Runner, limit: int) -> list[Row]:
        return await self._rows(conn, "periodic_list", limit)

    async def metrics_queues(self, conn: Runner, max_queues: int) -> list[Row]:
        """Per queue (the first `max_queues` by name): `jobs` by `status`, and
        `oldest_pending_seconds` (None when no pending job is due). Its counts read the whole
        table: in a transaction that lets them, on the worker's pool that does not."""
        async with transaction(conn) as c:
            await self.seqscan_allow(c)
            return await c.fetch(self._sql["metrics_queues"], max_queues)

    async def seqscan_allow(self, conn: Conn) -> None:
        """Let the rest of `conn`'s transaction scan whole tables (see metrics_queues)."""
        await conn.execute(self._sql["seqscan_allow"])

    async def workers_prune(self, conn: Runner, unseen_for: float) -> None:
        await conn.execute(self._sql["workers_prune"], unseen_for)

    async def limits_prune(self, conn: Runner, batch: int) -> int:
        """Forget the rate windows not written for a day (at most `batch`); how many went."""
        forgotten: int = await conn.fetchval(self._sql["limits_prune"], batch)
        return forgotten

    # --- operators ----------------------------------------------------------------------------

    async def job_cancel(self, conn: Runner, job_id: int) -> Row | None:
        """Cancel a job; returns its previous status (and worker), or None when it does not
        exist. A running job's worker is notified by the statement, when it commits."""
        rows = await self._rows(conn, "job_cancel", job_id)
        return rows[0] if rows else None

    async def status_counts(self, conn: Runner) -> list[Row]:
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["status_counts"])

    async def status_oldest_pending(self, conn: Runner) -> list[Row]:
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["status_oldest_pending"])

    async def status_unserved(self, conn: Runner, live_within: float) -> list[Row]:
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["status_unserved"], live_within)

    async def status_workers(self, conn: Runner, live_within: float) -> list[Row]:
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["status_workers"], live_within)

    async def privileges_missing(self, conn: Runner) -> list[Row]:
        try:
            return await conn.fetch(self._sql["privileges_missing"], self.schema)
        except asyncpg.exceptions.InsufficientPrivilegeError as exc:
            raise privilege_error(self.schema, exc) from exc

    # --- steps and milestones (ctx.step, ctx.transactional_step, ctx.progress) ---------------

    async def job_steps_done(
        self, conn: Runner, attempt: AttemptKey
    ) -> tuple[bool, dict[str, str]]:
        """Whether `attempt` still holds its job, and the job's steps done: their stored results
        (JSON text) by name."""
        rows = await conn.fetch(self._sql["job_steps_done"], *attempt)
        held = bool(rows and rows[0]["held"])
        return held, {r["name"]: r["result"] for r in rows if r["name"] is not None}

    async def step_transaction(self, conn: Runner) -> int:
        """The id of the transaction `conn` is in (one is assigned if it had none)."""
        return int(await conn.fetchval(self._sql["step_transaction"]))

    async def job_step_record(
        self,
        conn: Runner,
        attempt: AttemptKey,
        name: str,
        result: str,
        started_at: datetime | None,
        transaction: int | None = None,
    ) -> tuple[bool, str | None]:
        """Record a step under `attempt`'s fence and, given `transaction`, only inside that
        transaction. (False, None) when `conn` is in another transaction; else (True, the stored
        result as JSON text), or (True, None) when the attempt no longer holds its job. In a
        transactional step's transaction, planned with its values (plan_with_values.sql): the
        steps' sessions are not set up as the worker's, which plan by index only."""
        if transaction is not None:
            await self.plan_with_values(conn)
        row = await conn.fetchrow(
            self._sql["job_step_record"], *attempt, name, result, started_at, transaction
        )
        assert row is not None  # one row, always
        stored = row["result"]
        return bool(row["own"]), None if stored is None else str(stored)

    async def plan_with_values(self, conn: Runner) -> None:
        """Plan each statement of the rest of `conn`'s transaction anew, with its values."""
        await conn.execute(self._sql["plan_with_values"])

    async def job_progress(
        self, conn: Runner, attempt: AttemptKey, milestone: str, detail: str | None
    ) -> bool:
        """Set the job's progress and add the milestone to its history, under `attempt`'s fence;
        False when the attempt no longer holds its job."""
        noted = await conn.fetchval(self._sql["job_progress"], *attempt, milestone, detail)
        return noted is not None

    async def job_steps_of(self, conn: Runner, job_id: int) -> list[Row]:
        return await self._rows(conn, "job_steps_of", job_id)

    async def job_milestones_of(self, conn: Runner, job_id: int) -> list[Row]:
        return await self._rows(conn, "job_milestones_of", job_id)

    async def job_attempts_of(self, conn: Runner, job_id: int) -> list[Row]:
        return await self._rows(conn, "job_attempts_of", job_id)

    async def job_events_of(self, conn: Runner, job_id: int) -> list[Row]:
        return await self._rows(conn, "job_events_of", job_id)

    # --- events (ctx.wait_for_event, pgworker.emit) -------------------------------------------

    async def event_wait(
        self, conn: Conn, attempt: AttemptKey, seq: int, name: str, seconds: float | None
    ) -> Row:
        """Wait `seq` of the attempt's job for event `name` (timing out after `seconds`, None:
        never), recorded or resumed (see event_wait.sql) in a transaction of its own on `conn`,
        after the name's advisory lock."""
        async with conn.transaction():
            await self.event_lock(conn, name)
            row = await conn.fetchrow(self._sql["event_wait"], *attempt, seq, name, seconds)
        assert row is not None  # one row, always
        return row

    async def event_lock(self, conn: Runner, name: str) -> None:
        """The transaction-scoped lock that makes the waits and emits of event `name` take
        turns (see event_lock.sql)."""
        await conn.execute(self._sql["event_lock"], name)

    async def event_emit(self, conn: Runner, name: str, data: str | None) -> int:
        """Emit event `name` (data as JSON text); how many waiting jobs it woke."""
        with schema_errors(self.schema):
            woken: int = await conn.fetchval(self._sql["event_emit"], name, data)
        return woken

    async def jobs_woken(self, conn: Runner, ids: Sequence[int]) -> list[int]:
        """Of `ids` (jobs whose attempt just ended waiting), those already due again."""
        return [r["id"] for r in await conn.fetch(self._sql["jobs_woken"], list(ids))]

    async def events_prune(self, conn: Runner, age: float, batch: int) -> int:
        """Forget at most `batch` events older than `age` seconds; how many went."""
        forgotten: int = await conn.fetchval(self._sql["events_prune"], age, batch)
        return forgotten

    async def job_event_waits_of(self, conn: Runner, job_id: int) -> list[Row]:
        return await self._rows(conn, "job_event_waits_of", job_id)

    # --- queue controls -------------------------------------------------------------------------

    async def queue_pause(
        self, conn: Runner, queue: str, actor: str, reason: str | None
    ) -> Row | None:
        """Pause `queue` and log it, unless it is paused already; its controls after, whether
        this paused it (`changed`) and whether anything named it before (`known`). None when a
        concurrent pause created its row meanwhile: run it again."""
        with schema_errors(self.schema):
            return await conn.fetchrow(self._sql["queue_pause"], queue, actor, reason)

    async def queue_resume(self, conn: Runner, queue: str, actor: str, reason: str | None) -> Row:
        """Resume `queue`, log it and wake its workers at commit, if it is paused; its controls
        after, `changed` and `known`."""
        with schema_errors(self.schema):
            row = await conn.fetchrow(self._sql["queue_resume"], queue, actor, reason)
        assert row is not None  # one row, always
        return row

    async def queue_limit(
        self,
        conn: Runner,
        queue: str,
        actor: str,
        reason: str | None,
        max_running: tuple[bool, int | None],
        rate: tuple[bool, int | None, int | None],
    ) -> Row | None:
        """Set the limits asked for (`(True, value)`; `(False, ...)` leaves one as it is), log
        the change and wake the queue's workers at commit, unless nothing changes; the controls
        after, `changed` and `known`. None when a concurrent change created the queue's row
        meanwhile: run it again."""
        with schema_errors(self.schema):
            return await conn.fetchrow(
                self._sql["queue_limit"], queue, actor, reason, *max_running, *rate
            )

    async def queue_controls(self, conn: Runner) -> list[Row]:
        """The controls of every queue that has a row, by name; no counts."""
        return await self._rows(conn, "queue_controls")

    async def queue_list(self, conn: Runner) -> list[Row]:
        """Every queue a job or a controls row names: its pause, limits, pending and running
        jobs."""
        return await self._rows(conn, "queue_list")

    # --- the web dashboard (pgworker/_web/dashboard.py) ------------------------------------

    async def jobs_filtered(
        self, conn: Runner, filters: Sequence[Any], before: int | None, limit: int
    ) -> list[Row]:
        """A page of the jobs matching `filters` (JobFilter.params), newest first (keyset on
        id, below `before`), without payloads or results, with their error's first line and
        their last attempt's traceback."""
        return await self._rows(conn, "jobs_filtered", *filters, before, limit)

    async def jobs_sorted(
        self,
        conn: Runner,
        filters: Sequence[Any],
        sort: str,
        descending: bool,
        after: tuple[float | None, int] | None,
        limit: int,
    ) -> list[Row]:
        """A page of the jobs matching `filters` ordered by the column `sort` (one of an
        allow-list the caller checks), then by id, after the (sort_key, id_key) of the previous
        page's last row; the columns of jobs_filtered and each row's `sort_key`, `id_key`."""
        value, key = after if after is not None else (None, None)
        return await self._rows(conn, "jobs_sorted", *filters, sort, descending, value, key, limit)

    async def jobs_held(self, conn: Runner, queues: Sequence[str]) -> list[Row]:
        """The queues of `queues` with a limit, their running jobs and the starts in their rate
        window now (see jobs_held.sql)."""
        return await self._rows(conn, "jobs_held", list(queues))

    async def job_event_record(
        self, conn: Runner, job_id: int, kind: str, actor: str, detail: str | None
    ) -> None:
        """Record what an operator did to a job (job_events: its page, the operator log)."""
        with schema_errors(self.schema):
            await conn.execute(self._sql["job_event_record"], job_id, kind, actor, detail)

    async def jobs_failure_groups(
        self, conn: Runner, filters: Sequence[Any], limit: int
    ) -> list[Row]:
        """The finished jobs matching `filters` grouped by their latest error's group: its
        fingerprint, type, error_class, count, first_seen, last_seen, sample and trend."""
        return await self._rows(conn, "jobs_failure_groups", *filters, limit)

    async def attempts_failure_groups(
        self,
        conn: Runner,
        since: datetime,
        queue: str | None,
        type: str | None,
        limit: int,
    ) -> list[Row]:
        """The failed attempts since `since` of the jobs still being retried, grouped as
        `jobs_failure_groups` groups failed jobs."""
        return await self._rows(conn, "attempts_failure_groups", since, queue, type, limit)

    async def jobs_filtered_count(
        self, conn: Runner, filters: Sequence[Any], max_id: int | None
    ) -> tuple[int, int]:
        """The highest id (`max_id`, or the highest now) and how many jobs up to it match."""
        row = (await self._rows(conn, "jobs_filtered_count", *filters, max_id))[0]
        return int(row["max_id"]), int(row["matched"])

    # --- bulk actions (pgworker/_bulk.py) ----------------------------------------------------

    async def bulk_batch_ids(
        self, conn: Runner, filters: Sequence[Any], cursor: int, max_id: int, limit: int
    ) -> list[int]:
        """The next ids matching `filters` above `cursor`, at most `max_id`, lowest first."""
        rows = await self._rows(conn, "bulk_batch_ids", *filters, cursor, max_id, limit)
        return [r["id"] for r in rows]

    async def bulk_action_create(
        self,
        conn: Runner,
        kind: str,
        filter_json: str,
        run_at: datetime | None,
        max_id: int,
        matched: int,
        actor: str,
        reason: str | None,
    ) -> Row:
        rows = await self._rows(
            conn, "bulk_action_create", kind, filter_json, run_at, max_id, matched, actor, reason
        )
        return rows[0]

    async def bulk_action_get(self, conn: Runner, action_id: int) -> Row | None:
        rows = await self._rows(conn, "bulk_action_get", action_id)
        return rows[0] if rows else None

    async def bulk_action_lock(
        self, conn: Conn, action_id: int, runner: str | None, lease: float
    ) -> Row | None:
        """The running action, locked for a batch and its lease renewed; None when not running,
        held by a runner other than `runner` (None: any), or locked by another session."""
        rows = await self._rows(conn, "bulk_action_lock", action_id, runner, lease)
        return rows[0] if rows else None

    async def bulk_actions_claim(
        self, conn: Runner, runner: str, kind: str, lease: float, action_id: int | None = None
    ) -> list[Row]:
        """The running actions `runner` holds now (`id`, and `previous`: the owner it took one
        over from), their leases renewed: its own, the free ones and the orphans."""
        return await self._rows(conn, "bulk_actions_claim", runner, kind, lease, action_id)

    async def bulk_actions_release(self, conn: Runner, runner: str) -> None:
        """Leave `runner`'s running actions to the other runners at once."""
        with schema_errors(self.schema):
            await conn.execute(self._sql["bulk_actions_release"], runner)

    async def bulk_actions_list(
        self, conn: Runner, state: str | None, before: int | None, limit: int
    ) -> list[Row]:
        """The bulk actions, newest first, of `state` (None: any) below the id `before`."""
        return await self._rows(conn, "bulk_actions_list", state, before, limit)

    async def bulk_action_advance(
        self, conn: Conn, action_id: int, cursor: int, done: int, skipped: int, finished: bool
    ) -> None:
        with schema_errors(self.schema):
            await conn.execute(
                self._sql["bulk_action_advance"], action_id, cursor, done, skipped, finished
            )

    async def bulk_action_fail(self, conn: Runner, action_id: int, error: str) -> None:
        with schema_errors(self.schema):
            await conn.execute(self._sql["bulk_action_fail"], action_id, error)

    async def jobs_cancel_many(
        self, conn: Conn, ids: Sequence[int], actor: str, reason: str | None, action_id: int
    ) -> list[int]:
        """Cancel the pending and running jobs of `ids` (a running job's worker is notified when
        the transaction commits); the ids changed."""
        rows = await self._rows(conn, "jobs_cancel_many", list(ids), actor, reason, action_id)
        return [r["id"] for r in rows]

    async def jobs_reschedule_many(
        self,
        conn: Conn,
        ids: Sequence[int],
        run_at: datetime,
        actor: str,
        reason: str | None,
        action_id: int,
    ) -> list[int]:
        rows = await self._rows(
            conn, "jobs_reschedule_many", list(ids), run_at, actor, reason, action_id
        )
        return [r["id"] for r in rows]

    async def jobs_delete_many(
        self, conn: Conn, ids: Sequence[int], actor: str, reason: str | None, action_id: int
    ) -> list[int]:
        rows = await self._rows(conn, "jobs_delete_many", list(ids), actor, reason, action_id)
        return [r["id"] for r in rows]

    async def dashboard_workers(self, conn: Runner, limit: int, kept: float) -> list[Row]:
        """The workers seen within `kept` seconds, most recently seen first, at most `limit`."""
        return await self._rows(conn, "dashboard_workers", limit, kept)

    async def dashboard_overdue(self, conn: Runner, limit: int) -> list[Row]:
        return await self._rows(conn, "dashboard_overdue", limit)

    # --- the console's charts ----------------------------------------------------------------

    async def stats_plan(self, conn: Runner) -> None:
        """Bitmap scans on and JIT off for the rest of the transaction (the charts' ranges)."""
        await conn.execute(self._sql["stats_plan"])

    async def stats_window(
        self,
        conn: Runner,
        since: datetime,
        until: datetime,
        bucket: int,
        queue: str,
        type_: str,
        direct: int,
    ) -> list[Row]:
        """Per bucket of `bucket` seconds: jobs enqueued, attempts completed and failed, their
        wait and run histograms; the rollup's minutes and at most `direct` others. Planned with
        bitmap scans (stats_plan.sql), in a transaction (or a savepoint of the caller's)."""
        with schema_errors(self.schema):
            async with transaction(conn) as c:
                await self.stats_plan(c)
                return await c.fetch(
                    self._sql["stats_window"], since, until, bucket, queue, type_, direct
                )

    async def stats_rollup_due(
        self, conn: Runner, settle: float, recheck: float, reach: float, limit: int
    ) -> list[datetime]:
        """The minutes to roll up next (at most `limit`), those never rolled up first."""
        return [
            r["minute"]
            for r in await self._rows(conn, "stats_rollup_due", settle, recheck, reach, limit)
        ]

    async def stats_rollup_empty(
        self, conn: Runner, leader: str | None, reach: float, recheck: float
    ) -> int:
        """Mark the minutes before the oldest job as rolled up, empty (see
        stats_rollup_empty.sql); how many."""
        with schema_errors(self.schema):
            marked: int = await conn.fetchval(
                self._sql["stats_rollup_empty"], leader, reach, recheck
            )
        return marked

    async def stats_rollup(self, conn: Runner, minute: datetime, leader: str | None) -> Row:
        """Roll minute `minute` up again from scratch (fenced by `leader`'s lease when given)."""
        with schema_errors(self.schema):
            async with transaction(conn) as c:
                await self.stats_plan(c)
                row = await c.fetchrow(self._sql["stats_rollup"], minute, leader)
        assert row is not None  # one row, always
        return row

    async def stats_prune(self, conn: Runner, age: float, batch: int) -> int:
        """Forget the rollup of at most `batch` minutes older than `age` seconds; how many."""
        forgotten: int = await conn.fetchval(self._sql["stats_prune"], age, batch)
        return forgotten

    async def dashboard_operator_log(
        self,
        conn: Runner,
        before: tuple[datetime, str, int] | None,
        limit: int,
    ) -> list[Row]:
        at, source, id_ = before if before is not None else (None, None, None)
        return await self._rows(conn, "dashboard_operator_log", at, source, id_, limit)

    # --- failed jobs, replay, retention ------------------------------------------------------

    async def jobs_failed(
        self,
        conn: Runner,
        type_: str | None,
        queue: str | None,
        since: datetime | None,
        limit: int,
    ) -> list[Row]:
        """Failed jobs, newest failure first, with their first and last attempts' start times."""
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["jobs_failed"], type_, queue, since, limit)

    async def jobs_failed_ids(
        self, conn: Runner, type_: str, queue: str | None, since: datetime | None
    ) -> list[int]:
        """The ids of the failed jobs of a type (and queue, and failed since), oldest first."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["jobs_failed_ids"], type_, queue, since)
        return [r["id"] for r in rows]

    async def jobs_statuses(self, conn: Runner, ids: Sequence[int]) -> dict[int, str]:
        """The status of each of `ids` that exists."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["jobs_statuses"], list(ids))
        return {r["id"]: r["status"] for r in rows}

    async def jobs_unique_held(self, conn: Runner, ids: Sequence[int]) -> dict[int, int]:
        """Of `ids`, the failed or cancelled jobs whose unique key a live job holds, with it."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["jobs_unique_held"], list(ids))
        return {r["id"]: r["held_by"] for r in rows}

    async def jobs_replay(
        self,
        conn: Runner,
        ids: Sequence[int],
        actor: str,
        reason: str | None,
        action_id: int | None = None,
    ) -> list[Row]:
        """Put the failed or cancelled jobs of `ids` back to pending and record who did it (and
        the bulk action `action_id` that did, if one did); one row per job found (previous
        status, replayed or not). The workers are woken when the caller's transaction commits."""
        with schema_errors(self.schema):
            return await conn.fetch(self._sql["jobs_replay"], list(ids), actor, reason, action_id)

    async def jobs_prune(
        self,
        conn: Runner,
        ages: Mapping[str, float],
        limit: int,
        leader: str | None = None,
    ) -> dict[str, int]:
        """Delete one batch of at most `limit` finished jobs older than the age of their status
        (seconds by status), with everything recorded about them; how many of each status went.
        With `leader`, only while that worker holds the maintenance lease."""
        with schema_errors(self.schema):
            rows = await conn.fetch(
                self._sql["jobs_prune"], list(ages), list(ages.values()), limit, leader
            )
        return {r["status"]: r["jobs"] for r in rows}

    async def jobs_prunable(self, conn: Runner, ages: Mapping[str, float]) -> dict[str, int]:
        """What jobs_prune would delete, counted by status."""
        with schema_errors(self.schema):
            rows = await conn.fetch(self._sql["jobs_prunable"], list(ages), list(ages.values()))
        return {r["status"]: r["jobs"] for r in rows}

    # --- pgworker.testing (users' test suites) -----------------------------------------------

    async def testing_jobs(
        self,
        conn: Runner,
        *,
        type_: str | None = None,
        queue: str | None = None,
        statuses: Sequence[str] | None = None,
        payload: str | None = None,
        payload_contains: str | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        priority: int | None = None,
    ) -> list[Row]:
        """The jobs matching every filter given (None: any), oldest first; payloads as JSON
        text."""
        with schema_errors(self.schema):
            return await conn.fetch(
                self._sql["testing_jobs"],
                type_,
                queue,
                None if statuses is None else list(statuses),
                payload,
                payload_contains,
                idempotency_key,
                correlation_id,
                priority,
            )

    async def testing_advance(self, conn: Runner, seconds: float) -> int:
        """Move the pending jobs' schedule `seconds` earlier; how many moved."""
        with schema_errors(self.schema):
            moved: int = await conn.fetchval(self._sql["testing_advance"], seconds)
        return moved

    async def testing_next_due(
        self,
        conn: Runner,
        queues: Sequence[str],
        version_1_types: Sequence[str],
        other_versions: Sequence[str],
    ) -> float | None:
        """Seconds until the next job a claim would take is due (<= 0: due), or None."""
        with schema_errors(self.schema):
            due: float | None = await conn.fetchval(
                self._sql["testing_next_due"],
                list(queues),
                list(version_1_types),
                list(other_versions),
            )
        return due

    async def testing_reset(self, conn: Runner) -> None:
        """Empty the schema's tables but the migrations."""
        with schema_errors(self.schema):
            await conn.execute(self._sql["testing_reset"])

    async def testing_database_create(self, conn: Conn, database: str) -> None:
        """Create database `database`, a plain identifier (the only other name put in SQL)."""
        await conn.execute(_with_database(self._sql["testing_database_create"], database))

    async def testing_database_drop(self, conn: Conn, database: str) -> None:
        await conn.execute(_with_database(self._sql["testing_database_drop"], database))

    # --- migrations ---------------------------------------------------------------------------

    async def server_version(self, conn: Conn) -> tuple[str, int]:
        """The server's version as it names itself (`15.20 (Debian 15.20-0+deb12u1)`), and its
        major."""
        row = await conn.fetchrow(self._sql["server_version"])
        assert row is not None
        return str(row["version"]), int(row["major"])

    async def session_identity(self, conn: Runner) -> tuple[int, str]:
        """The server process of the session `conn` reaches, and its database."""
        row = await conn.fetchrow(self._sql["session_identity"])
        assert row is not None  # one row, always
        return int(row["pid"]), str(row["database"])

    async def session_settings(self, conn: Runner) -> str:
        """The session's plan_cache_mode, which a direct pool sets at connection."""
        return str(await conn.fetchval(self._sql["session_settings"]))

    async def migrations_lock(self, conn: Conn) -> None:
        await conn.execute(self._sql["migrations_lock"], self.schema)

    async def migrations_lock_xact(self, conn: Conn) -> None:
        await conn.execute(self._sql["migrations_lock_xact"], self.schema)

    async def migrations_unlock(self, conn: Conn) -> None:
        await conn.execute(self._sql["migrations_unlock"], self.schema)

    async def migrations_bootstrap(self, conn: Conn) -> None:
        await conn.execute(self._sql["migrations_bootstrap"])

    async def migrations_applied(self, conn: Conn) -> set[int]:
        return {r["version"] for r in await conn.fetch(self._sql["migrations_applied"])}

    async def migrations_record(self, conn: Conn, version: int, name: str) -> None:
        await conn.execute(self._sql["migrations_record"], version, name)

    async def migrations_table_exists(self, conn: Runner) -> bool:
        return bool(await conn.fetchval(self._sql["migrations_table_exists"], self.schema))

    async def migrations_latest(self, conn: Runner) -> int | None:
        latest: int | None = await conn.fetchval(self._sql["migrations_latest"])
        return latest

    # --- savepoints in a transaction begun with a raw BEGIN (savepointed) -----------------------

    async def savepoint(self, conn: Conn) -> None:
        await conn.execute(self._sql["savepoint"])

    async def savepoint_release(self, conn: Conn) -> None:
        await conn.execute(self._sql["savepoint_release"])

    async def savepoint_rollback(self, conn: Conn) -> None:
        await conn.execute(self._sql["savepoint_rollback"])

    # --- the HTTP API (pgworker serve) ---------------------------------------------------------

    async def request_bounds(
        self, conn: Conn, lock: float, statement: float, client_check: float | None
    ) -> None:
        """Bound each later statement of the transaction on `conn`, for that transaction only:
        `lock` seconds waiting on a lock, `statement` seconds running; and, unless None, roll it
        back within `client_check` seconds of its client closing the connection."""
        ms = [str(max(1, round(s * 1000))) for s in (lock, statement)]
        check = None if client_check is None else str(max(1, round(client_check * 1000)))
        await conn.execute(self._sql["request_bounds"], *ms, check)

    async def request_client_check(self, conn: Conn, seconds: float) -> None:
        """Set client_connection_check_interval for the transaction on `conn`: raises when the
        server knows no such setting, or refuses a value on its system."""
        await conn.execute(self._sql["request_client_check"], str(max(1, round(seconds * 1000))))

    async def http_job_claim(
        self,
        conn: Runner,
        worker_id: str,
        *,
        queues: Sequence[str] | None,
        types: Sequence[str] | None,
        versions: Mapping[str, Sequence[int]],
        lease: float,
        default_max_retries: int,
    ) -> Row | None:
        """Claim one due job for an HTTP worker, durably (see http_job_claim.sql); the whole
        job, or None when nothing is due."""
        keys = [f"{t}@{v}" for t, allowed in versions.items() for v in allowed]
        with schema_errors(self.schema):
            return await conn.fetchrow(
                self._sql["http_job_claim"],
                worker_id,
                None if queues is None else list(queues),
                None if types is None else list(types),
                list(versions),
                keys,
                lease,
                default_max_retries,
            )

    async def http_worker_seen(
        self,
        conn: Runner,
        worker_id: str,
        hostname: str,
        queues: Sequence[str] | None = None,
        types: Sequence[str] | None = None,
        lease: float | None = None,
    ) -> None:
        with schema_errors(self.schema):
            await conn.execute(
                self._sql["http_worker_seen"],
                worker_id,
                hostname,
                None if queues is None else list(queues),
                None if types is None else list(types),
                lease,
            )

    async def http_jobs_list(
        self,
        conn: Runner,
        filters: Sequence[Any],
        *,
        before: int | None,
        limit: int,
        budget: int,
    ) -> tuple[list[Row], bool]:
        """A page of jobs, newest first, below the id `before`, and whether it was cut short (a
        next page may follow). Read one row at a time and cut once its payloads, results and
        milestones reach `budget` bytes of JSON (never below one job): each may hold 64 MB, and
        a page of a thousand of them would not fit in memory."""
        rows: list[Row] = []
        size = 0
        filters = tuple(filters)
        with schema_errors(self.schema):
            async with (
                transaction(conn) as c,
                contextlib.aclosing(self._one_by_one(c, filters, before, limit)) as found,
            ):
                async for row in found:
                    more = sum(len(row[k] or "") for k in ("payload", "result", "progress"))
                    if rows and size + more > budget:
                        return rows, True
                    rows.append(row)
                    size += more
                    if len(rows) >= limit:
                        return rows, True
        return rows, False

    async def _one_by_one(
        self, c: Conn, filters: tuple[Any, ...], before: int | None, limit: int
    ) -> AsyncGenerator[Row, None]:
        """The rows of http_jobs_list one at a time: from a cursor, whose statement asyncpg
        prepares by name; through a transaction pooler, where a named statement stays on a
        server session that other clients get, one row per statement, each below the last id."""
        sql = self._sql["http_jobs_list"]
        if not through_pooler(c):
            async for row in c.cursor(sql, *filters, before, limit, prefetch=1):
                yield row
            return
        for _ in range(limit):
            found = await c.fetchrow(sql, *filters, before, 1)
            if found is None:
                return
            yield found
            before = found["id"]

    async def http_workers(self, conn: Runner) -> list[Row]:
        return await self._rows(conn, "http_workers")
