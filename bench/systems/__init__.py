"""One adapter per measured system: schema, bulk enqueue, one-at-a-time enqueue, the worker
command, the SQL that says when a drain is over and when its first job started and its last
completion was persisted, and what the report says about the system alone.

Every adapter uses its library's public API and plain SQL on the library's tables."""

from __future__ import annotations

from bench.systems.base import CONCURRENCY, Interval, System
from bench.systems.floor import Floor
from bench.systems.peers import ChancySystem, PgQueuer, PgQueuerDefaults, Procrastinate
from bench.systems.pgworker import (
    PgWorker,
    PgWorkerBase,
    PgWorkerDurable,
    PgWorkerMetrics,
    PgWorkerPooler,
)

SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        PgWorker(),
        PgWorkerDurable(),
        PgWorkerPooler(),
        PgWorkerMetrics(),
        PgWorkerBase(),
        Procrastinate(),
        PgQueuer(),
        PgQueuerDefaults(),
        ChancySystem(),
        Floor(),
    )
}
PEERS = ("procrastinate", "pgqueuer", "chancy")
LIB_SYSTEMS = ("pgworker", "pgworker-durable", "pgworker-pooler", *PEERS, "pgqueuer-defaults")
OPTIONAL = ("pgworker-metrics",)
"""Systems measured only when asked for (--systems)."""
BASE = "pgworker-base"  # pgworker from --base-src, only when asked for
GROWTH = "pgworker"  # the system W4 measures on a grown table

__all__ = [
    "BASE",
    "CONCURRENCY",
    "GROWTH",
    "LIB_SYSTEMS",
    "OPTIONAL",
    "PEERS",
    "SYSTEMS",
    "Interval",
    "PgWorker",
    "System",
]
