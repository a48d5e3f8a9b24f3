"""Whose turn it is: which idle worker claims when jobs arrive, and when each one polls, so that
a fleet of idle workers costs about one claim per job, and one poll per `poll_interval` in all,
rather than one of each per worker.

A notification of new jobs (the schema's function jobs_notification builds every one) names the
queue, the smallest new job id, how many jobs arrived and, when they all have the same, their
type. The live workers that serve that queue and that type, in worker_id order, take turns: the
`count` of them from position `id mod N` on claim (all of them when `count` >= N), the others
stay idle. Each worker reads the same list from
the `workers` table, so they agree without talking; a worker that starts (its listener connects)
says so on the jobs channel and every worker reads the list again, one that stops says so and
the others leave it out. A bare queue name (sent by the rescue, by replay and by a queue's resume)
wakes every worker of that queue. Anyone may NOTIFY the channel: what cannot be read wakes no one.

A chosen worker that is full passes its turn on at once: it sends the notification again, for
the next workers in the list (at most PASSES times, and once per poll interval per worker, so
that a saturated fleet does not pass every job around). Polls cover the jobs a chosen worker
does not take (it died without saying so, does not listen, could not pass, or the lists disagreed
for a moment): the live workers that serve the same queues and types poll one after the other,
each in its slot of `poll_interval` seconds of the wall clock, so that they poll once per
interval in all. Such a job waits at most one interval, two while the worker due to poll is one
that died, until the lists drop it (a lease), or a full one. A poll that fills every free slot has
found work that came without a notification (jobs that became due): it wakes every worker of
those queues."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import anyio

from .._db.connection import Executor
from .._db.queries import queries
from ..settings import Settings

PASSES = 3
"""How many times a notification is passed on by chosen workers that are full."""


class Pass(NamedTuple):
    """A turn passed on: the notification of new jobs to send again (Queries.jobs_pass)."""

    queue: str
    first: int
    """The position in the list of workers the turn goes to."""
    jobs: int
    """How many jobs arrived (the notification's `count`)."""
    first_type: str | None
    last_type: str | None
    """The first and last of the jobs' types (the same: they all have it), None when unknown."""
    hops: int
    """How many times it has been passed on, this time included."""


class _Peer(NamedTuple):
    worker_id: str
    queues: frozenset[str]
    types: frozenset[str]
    """Type names, without the `@version` of served keys."""
    group: tuple[tuple[str, ...], tuple[str, ...]]
    """What it serves, exactly: the workers that poll in turn serve the same."""


def _type_name(served_key: str) -> str:
    return served_key.rsplit("@", 1)[0] if "@" in served_key else served_key


def _peer(worker_id: str, queues: Sequence[str], served: Sequence[str]) -> _Peer:
    return _Peer(
        worker_id,
        frozenset(queues),
        frozenset(_type_name(k) for k in served),
        (tuple(sorted(set(queues))), tuple(sorted(set(served)))),
    )


class Turns:
    """This worker's view of the live workers, and the two decisions taken from it: claim on this
    notification or not (`mine`), and how long until the next poll (`poll_delay`)."""

    def __init__(self, settings: Settings, served: Sequence[str]) -> None:
        self._me = _peer(settings.worker_id, settings.served_queues, served)
        self._q = queries(settings.schema)
        self._poll_interval = settings.poll_interval
        self._seen_within = settings.lease
        self.refresh_every = settings.lease / 3
        self._refreshed_at = -math.inf
        self._gone: set[str] = set()
        self._rows: list[_Peer] = []
        self._stale = False
        self._passes: list[Pass] = []
        self._passed_at = -math.inf
        self._slot = self._polled_slot = 0
        self._bare = False
        self.full: Callable[[], bool] = lambda: False
        """Whether every slot is taken (the producer says)."""
        self.nudged = anyio.Event()
        """Set when the listener has something to do: read the list again (a worker came), or
        pass a turn on."""
        self._apply()

    @property
    def hello(self) -> str:
        """What this worker says on the jobs channel when its listener connects."""
        return json.dumps({"hello": self._me.worker_id})

    @property
    def bye(self) -> str:
        """What it says when it stops claiming."""
        return json.dumps({"bye": self._me.worker_id})

    @property
    def size(self) -> int:
        """The live workers it knows of, itself included."""
        return len(self._peers)

    @property
    def shared(self) -> bool:
        return len(self._peers) > 1

    def _apply(self) -> None:
        me = self._me
        peers = {p.worker_id: p for p in self._rows if p.worker_id not in self._gone}
        peers[me.worker_id] = me
        self._peers = [peers[w] for w in sorted(peers)]
        group = [p.worker_id for p in self._peers if p.group == me.group]
        self._rank, self._group_size = group.index(me.worker_id), len(group)
        self._chosen: dict[tuple[str, frozenset[str] | None], tuple[int, int]] = {}

    def due(self) -> bool:
        late = time.monotonic() >= self._refreshed_at + self.refresh_every
        return late or self._stale

    def take_bare(self) -> bool:
        """Whether a bare queue name came since the last call: a queue's controls may have
        changed (a resume, a limit), or a limited job ended."""
        bare, self._bare = self._bare, False
        return bare

    def take(self) -> list[Pass]:
        """The turns to pass on, once each; re-arms `nudged`."""
        self.nudged = anyio.Event()
        passes, self._passes = self._passes, []
        return passes

    async def refresh(self, conn: Executor) -> None:
        """Read the live workers again."""
        self._stale = False
        self._refreshed_at = time.monotonic()
        rows = await self._q.workers_live(conn, self._seen_within)
        self._rows = [_peer(r["worker_id"], r["queues"], r["types"]) for r in rows]
        # A worker that said bye is no one's turn while it drains; once its row is gone, the id
        # may serve again (a restarted worker of the same id says hello).
        self._gone &= {p.worker_id for p in self._rows}
        self._apply()

    def mine(self, payload: object) -> bool:
        """Whether this worker claims on this jobs notification."""
        if not isinstance(payload, str):
            return False
        if payload in self._me.queues:
            self._bare = True
            return True
        try:
            note = json.loads(payload)
        except (ValueError, RecursionError):
            return False
        if not isinstance(note, dict):
            return False
        if "hello" in note or "bye" in note:
            self._heard(note)
            return False
        queue, first, count, types = (note.get(k) for k in ("queue", "id", "count", "types"))
        if not isinstance(queue, str) or queue not in self._me.queues:
            return False
        listed = types if isinstance(types, list) else []
        wanted = frozenset(t for t in listed if isinstance(t, str)) or None
        if wanted is not None and not wanted & self._me.types:
            return False
        if not isinstance(first, int) or not isinstance(count, int) or count < 1:
            return True
        at, of = self._position(queue, wanted)
        chosen = min(count, of)
        if (at - first) % of >= chosen:
            return False
        return not self.full() or not self._pass(note, queue, first + chosen, count, wanted, of)

    def _pass(
        self,
        note: dict[str, object],
        queue: str,
        first: int,
        count: int,
        wanted: frozenset[str] | None,
        of: int,
    ) -> bool:
        """Pass a turn this full worker cannot take to the next workers in the list, from
        position `first` on, unless it has been passed too often (or would come back to workers
        it was passed from), or this worker passed one less than a poll interval ago: the polls
        cover it then."""
        hops = note.get("hops", 0)
        chosen = min(count, of)
        now = time.monotonic()
        if not isinstance(hops, int) or hops >= PASSES or (hops + 2) * chosen > of:
            return False
        if now < self._passed_at + self._poll_interval:
            return False
        self._passed_at = now
        first_type, last_type = (min(wanted), max(wanted)) if wanted else (None, None)
        self._passes.append(Pass(queue, first, count, first_type, last_type, hops + 1))
        self.nudged.set()
        return True

    def _position(self, queue: str, wanted: frozenset[str] | None) -> tuple[int, int]:
        """This worker's place among the live workers that serve `queue` and one of `wanted`."""
        key = (queue, wanted)
        found = self._chosen.get(key)
        if found is None:
            ids = [
                p.worker_id
                for p in self._peers
                if queue in p.queues and (wanted is None or wanted & p.types)
            ]
            found = self._chosen[key] = (ids.index(self._me.worker_id), len(ids))
        return found

    def _heard(self, note: dict[str, object]) -> None:
        hello, bye = note.get("hello"), note.get("bye")
        if isinstance(bye, str) and bye != self._me.worker_id:
            self._gone.add(bye)
            self._apply()
        elif isinstance(hello, str):
            self._gone.discard(hello)
            self._stale = True
            self.nudged.set()

    def poll_delay(self, now: float) -> float:
        """Seconds from `now` (wall clock) to the start of this worker's next poll slot, one it
        has not polled in yet (a timer may end a little before the slot begins)."""
        interval, size = self._poll_interval, self._group_size
        slot = max(math.floor(now / interval), self._polled_slot) + 1
        self._slot = slot + (self._rank - slot) % size
        return max(self._slot * interval - now, 0.0)

    def polled(self) -> None:
        """The wait for the slot `poll_delay` gave ended: this worker polls in it."""
        self._polled_slot = self._slot
