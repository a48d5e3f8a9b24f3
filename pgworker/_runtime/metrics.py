"""The observe step: a worker's Prometheus metrics, served at http://host:port/metrics.

Imported only when a worker has `metrics_port`; prometheus_client (the `metrics` extra) is imported
when the server starts. The hot path never touches prometheus_client: a job's outcome adds one to a
plain int and two histogram buckets of this module's own, and a scrape (on the server's thread)
turns those into metric families. Each Worker has a CollectorRegistry of its own, so that two
workers of one process serve their own figures on their own ports.

Labels are queues and job types only, never ids; prometheus_client escapes whatever a type name
holds. The queue gauges come from the elected worker alone (see the _maintenance package) and
are cleared when it stops leading."""

from __future__ import annotations

import errno
import socket
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .._version import DISTRIBUTION
from ..errors import ConfigError
from ..models import AttemptResult, JobStatus, Outcome
from ..settings import Settings

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from .._attempt import Attempt

BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
"""Upper bounds (seconds) of the run and wait histograms' buckets, then +Inf."""
_LE = [f"{b:g}" for b in BUCKETS] + ["+Inf"]

COUNTED = tuple(o for o in Outcome if o not in (Outcome.RUNNING, Outcome.LOST))
"""The outcomes a worker counts when its attempt ends. `lost` is counted by the elected worker's
rescue (an attempt stopped here because its job was claimed again was already counted there)."""
OUTCOMES = (*(o.value for o in COUNTED), Outcome.LOST.value)

STATUSES = tuple(s.value for s in JobStatus)
MAX_QUEUES = 1000
"""The most queues the queue gauges show (by name): queue names come from whoever enqueues."""
MAX_LOST_SERIES = 1000
"""The most (queue, type) series the rescue's `lost` count adds: it finds jobs of any queue and
type (HTTP workers claim whatever a client names), so past this many, further ones are counted
under OTHER."""
OTHER = ("(other)", "(other)")


def require() -> None:
    """prometheus_client is installed, else the ConfigError that says what to install."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "metrics_port",
            f"metrics need prometheus-client: pip install '{DISTRIBUTION}[metrics]'",
        ) from None


class _Histogram:
    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        counts, running, buckets = list(self.counts), 0, []
        for le, n in zip(_LE, counts, strict=True):
            running += n
            buckets.append((le, float(running)))
        return buckets


class _Series:
    """What is counted for one (queue, type)."""

    __slots__ = ("outcomes", "run", "wait")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.run = _Histogram()
        self.wait = _Histogram()


class Metrics:
    """One worker's figures, and the HTTP server that shows them."""

    def __init__(self, settings: Settings) -> None:
        self._s = settings
        self._series: dict[tuple[str, str], _Series] = {}
        self._unsettled: dict[tuple[int, int], tuple[str, str]] = {}
        """The (queue, type) of attempts ended here whose outcome is not yet written."""
        self.claims = 0
        self.slots = settings.concurrency
        self.busy: Callable[[], int] = lambda: 0
        self.reconnects: Callable[[], int] = lambda: 0
        self._queues: tuple[Sequence[Any], dict[str, float]] | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def _add(self, key: tuple[str, str]) -> _Series:
        series = self._series[key] = _Series()
        return series

    # --- what the worker reports ------------------------------------------------------------

    def claimed(self, records: Iterable[Any]) -> None:
        """Jobs just claimed: each waited from its due time (run_at) to its claim."""
        for r in records:
            self.claims += 1
            key = (r["queue"], r["type"])
            series = self._series.get(key) or self._add(key)
            waited: float = (r["claimed_at"] - r["run_at"]).total_seconds()
            series.wait.observe(waited if waited > 0.0 else 0.0)

    def finished(self, attempt: Attempt, result: AttemptResult, now: float) -> None:
        """An attempt ended here with `result`; `now` is time.monotonic(). Its outcome is
        counted once written (`settled`)."""
        if result.outcome is Outcome.LOST:
            return
        key = (attempt.queue, attempt.type)
        series = self._series.get(key) or self._add(key)
        self._unsettled[(result.job_id, result.attempt)] = key
        if attempt.started is not None:
            series.run.observe(now - attempt.started)

    def settled(self, result: AttemptResult, outcome: str | None) -> None:
        """The completer wrote `result`, and its attempt row holds `outcome` (which the database
        may have made `cancelled`); None: it was not written (fenced: the job runs elsewhere, or
        was rescued and counted `lost`)."""
        key = self._unsettled.pop((result.job_id, result.attempt), None)
        if key is None or outcome is None or outcome not in OUTCOMES or outcome == Outcome.LOST:
            return
        series = self._series.get(key) or self._add(key)
        series.outcomes[outcome] += 1

    def lost(self, rescued: Iterable[tuple[str, str]]) -> None:
        """The (queue, type) of jobs the elected worker's rescue found with an expired lease."""
        for key in rescued:
            series = self._series.get(key)
            if series is None:
                if len(self._series) >= MAX_LOST_SERIES:
                    key = OTHER
                series = self._series.get(key) or self._add(key)
            series.outcomes[Outcome.LOST] += 1

    def queues(self, rows: Sequence[Any] | None) -> None:
        """The queue gauges from metrics_queues.sql; None clears them (leadership lost)."""
        if rows is None:
            self._queues = None
            return
        oldest = {
            r["queue"]: r["oldest_pending_seconds"]
            for r in rows
            if r["oldest_pending_seconds"] is not None
        }
        self._queues = (rows, oldest)

    # --- the scrape, on the server's thread -------------------------------------------------

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        series = list(self._series.items())
        jobs = CounterMetricFamily(
            "pgworker_jobs",
            "Attempts ended, by outcome (lost: found by the elected worker's rescue).",
            labels=["queue", "type", "outcome"],
        )
        run = HistogramMetricFamily(
            "pgworker_job_run_seconds",
            "Seconds an attempt's handler ran.",
            labels=["queue", "type"],
        )
        wait = HistogramMetricFamily(
            "pgworker_job_wait_seconds",
            "Seconds from a job's due time (run_at) to its claim.",
            labels=["queue", "type"],
        )
        for (queue, type_), s in series:
            for outcome, n in list(s.outcomes.items()):
                jobs.add_metric([queue, type_, outcome], n)
            for family, histogram in ((run, s.run), (wait, s.wait)):
                family.add_metric([queue, type_], histogram.cumulative(), histogram.total)
        yield from (jobs, run, wait)
        yield GaugeMetricFamily("pgworker_slots", "Jobs this worker runs at once.", self.slots)
        yield GaugeMetricFamily("pgworker_slots_busy", "Slots running a job.", self.busy())
        yield CounterMetricFamily("pgworker_claims", "Jobs claimed.", self.claims)
        yield CounterMetricFamily(
            "pgworker_db_reconnects",
            "Database connections lost and opened again.",
            self.reconnects(),
        )
        counts = GaugeMetricFamily(
            "pgworker_queue_jobs",
            "Jobs by queue and status (from the elected worker only).",
            labels=["queue", "status"],
        )
        oldest = GaugeMetricFamily(
            "pgworker_queue_oldest_pending_seconds",
            "Age of each queue's oldest due pending job, 0 when none is due (from the elected "
            "worker only).",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "pgworker_queue_paused",
            "1 for a paused queue, else 0 (from the elected worker only).",
            labels=["queue"],
        )
        most = GaugeMetricFamily(
            "pgworker_queue_max_running",
            "The queue's max_running limit, for a queue that has one (from the elected worker "
            "only).",
            labels=["queue"],
        )
        found = self._queues
        if found is not None:
            rows, ages = found
            by_queue: dict[str, dict[str, int]] = {}
            stopped: set[str] = set()
            limited: dict[str, int] = {}
            for r in rows:
                by_queue.setdefault(r["queue"], dict.fromkeys(STATUSES, 0))[r["status"]] = r["jobs"]
                if r["paused"]:
                    stopped.add(r["queue"])
                if r.get("max_running") is not None:
                    limited[r["queue"]] = r["max_running"]
            for queue, statuses in by_queue.items():
                for status, n in statuses.items():
                    counts.add_metric([queue, status], n)
                oldest.add_metric([queue], ages.get(queue, 0.0))
                paused.add_metric([queue], 1.0 if queue in stopped else 0.0)
            for queue, n in limited.items():
                most.add_metric([queue], float(n))
        yield counts
        yield oldest
        yield paused
        yield most

    # --- the server ---------------------------------------------------------------------------

    def start(self) -> None:
        """Serve /metrics on (metrics_host, metrics_port) from a daemon thread. A port in use or
        a host that cannot be bound is a ConfigError naming the setting; nothing stays open."""
        require()
        from prometheus_client import CollectorRegistry, start_http_server

        registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        host, port = self._s.metrics_host, self._s.metrics_port
        assert port is not None
        try:
            self._server, self._thread = start_http_server(port, host, registry)
        except OSError as exc:
            raise _bind_error(host, port, exc) from None

    def close(self) -> None:
        """Stop serving (blocks up to half a second: serve_forever's poll)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def port(self) -> int | None:
        """The port served (None before start)."""
        return None if self._server is None else int(self._server.server_address[1])


def _bind_error(host: str, port: int, exc: OSError) -> ConfigError:
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            "metrics_host",
            f"cannot serve metrics on {where} ({exc.strerror or exc}): give an address of this "
            "host, e.g. 127.0.0.1 or 0.0.0.0",
        )
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            "metrics_port",
            f"cannot serve metrics on {where}: the port is already in use; choose another "
            "--metrics-port (PGWORKER_METRICS_PORT) or stop what listens there",
        )
    return ConfigError("metrics_port", f"cannot serve metrics on {where}: {exc.strerror or exc}")
