"""Tracing (README, Tracing): the traceparent stored at enqueue on every insert path, and the
span of each attempt (its attributes, its link to the enqueuing span, its status), recorded by
the SDK's in-memory exporter against a real PostgreSQL and a real worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import asyncpg
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

import pgworker
from pgworker import JobSpec, RetryPolicy, _tracing
from pgworker._redact import REDACTED

from .helpers import ROOT, all_finished, wait_for

aio = pytest.mark.asyncio(loop_scope="session")

FAST = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=0.02, jitter=0.0)


def _install(provider: Any) -> None:
    """Make `provider` the global one. The API lets an application set it once per process;
    each test sets its own and puts the unset state back after, so that no other test file
    runs traced."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _install(provider)
    try:
        yield exporter
    finally:
        _install(None)
        provider.shutdown()


AN_ATTEMPT: Any = SimpleNamespace(
    id=1, number=1, type="t", queue="q", correlation_id="c", traceparent=None
)


def traceparent_of(span: Any) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def attempt_spans(exporter: InMemorySpanExporter, job_id: int | None = None) -> list[ReadableSpan]:
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("pgworker.job ")
        and (job_id is None or s.attributes["pgworker.job.id"] == job_id)
    ]
    return sorted(found, key=lambda s: (s.attributes["pgworker.job.id"], s.start_time))


async def stored(conn: asyncpg.Connection, ids: list[int]) -> list[str | None]:
    rows = await conn.fetch(
        "SELECT id, traceparent FROM pgworker.jobs WHERE id = ANY($1::bigint[])", ids
    )
    by_id = {r["id"]: r["traceparent"] for r in rows}
    return [by_id[i] for i in ids]


# --- enqueue ---------------------------------------------------------------------------------


@aio
async def test_enqueue_under_a_span_stores_its_traceparent(conn, spans):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        r = await pgworker.enqueue(conn, "t", {"n": 1})
    expected = traceparent_of(span)
    assert int(expected[-2:], 16) & 1  # sampled
    assert await stored(conn, [r.job.id]) == [expected]
    assert r.job.traceparent == expected
    assert await pgworker.get_job(conn, r.job.id) == r.job


@aio
async def test_without_a_span_the_column_is_null_on_every_path(conn, spans):
    one = await pgworker.enqueue(conn, "t", {"n": 1})
    copied = await pgworker.enqueue_many(conn, [JobSpec("t", {"n": i}) for i in range(3)])
    keyed = await pgworker.enqueue_many(
        conn, [JobSpec("t", {"n": i}, idempotency_key=f"k{i}") for i in range(3)]
    )
    ids = [r.job.id for r in [one, *copied, *keyed]]
    assert await stored(conn, ids) == [None] * 7
    assert all(r.job.traceparent is None for r in [one, *copied, *keyed])


@aio
async def test_enqueue_many_stores_the_traceparent_on_the_copy_and_insert_paths(conn, spans):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("batch") as span:
        # COPY (no key, no schedule), over two chunks of 500 rows, with odd fields too.
        copied = await pgworker.enqueue_many(
            conn,
            [JobSpec("t", {"n": i, "s": "a\tb\\c\nd"}) for i in range(600)]
            + [JobSpec("t", {}, queue="q", priority=3, correlation_id="c\t1", max_retries=1)],
        )
        # One INSERT (a key, a delay), the duplicate key returning the first job.
        keyed = await pgworker.enqueue_many(
            conn,
            [
                JobSpec("t", {"n": 1}, idempotency_key="k1"),
                JobSpec("t", {"n": 2}, delay=0.5),
                JobSpec("t", {"n": 1}, idempotency_key="k1"),
            ],
        )
    expected = traceparent_of(span)
    ids = [r.job.id for r in copied]
    assert await stored(conn, ids) == [expected] * len(ids)
    assert await stored(conn, [r.job.id for r in keyed]) == [expected] * 3
    for r in [copied[0], copied[-1], *keyed]:
        assert await pgworker.get_job(conn, r.job.id) == r.job
    row = await conn.fetchrow("SELECT * FROM pgworker.jobs WHERE id = $1", copied[-1].job.id)
    assert (row["queue"], row["priority"], row["correlation_id"]) == ("q", 3, "c\t1")
    assert json.loads(row["payload"]) == {} and row["max_retries"] == 1


@aio
async def test_an_invalid_span_context_stores_nothing(conn, spans):
    token = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
    try:
        r = await pgworker.enqueue(conn, "t", {})
    finally:
        otel_context.detach(token)
    assert await stored(conn, [r.job.id]) == [None]


# --- the attempt's span ----------------------------------------------------------------------


@aio
async def test_an_attempt_span_has_the_attributes_the_link_and_the_handlers_spans(
    dsn, conn, pool, spans
):
    registry = pgworker.Registry()
    seen: dict[str, Any] = {}

    @registry.task("send-invoice", queue="mail")
    async def send_invoice(ctx: pgworker.JobContext, payload: Any) -> None:
        seen["current"] = trace.get_current_span()
        with trace.get_tracer("app").start_as_current_span("charge"):
            pass
        child = await pgworker.enqueue(pool, "receipt", {}, queue="mail")
        seen["child"] = child.job.id

    @registry.task("receipt", queue="mail")
    def receipt(ctx: pgworker.JobContext, payload: Any) -> None:  # a thread: context follows
        seen["receipt"] = trace.get_current_span()

    with trace.get_tracer("web").start_as_current_span("POST /invoices") as request:
        r = await pgworker.enqueue(
            conn, "send-invoice", {"n": 1}, queue="mail", correlation_id="req-7"
        )
        # A worker started inside a span: its attempts do not become that span's children.
        async with pgworker.Worker(registry, dsn, poll_interval=0.05):
            await wait_for(lambda: all_finished(conn))
            await wait_for(lambda: len(attempt_spans(spans)) == 2)
    (span,) = attempt_spans(spans, r.job.id)
    assert span.name == "pgworker.job send-invoice"
    assert span.kind is SpanKind.CONSUMER
    attributes = dict(span.attributes)
    assert {k: attributes[k] for k in attributes if k.startswith("pgworker.job.")} == {
        "pgworker.job.id": r.job.id,
        "pgworker.job.attempt": 1,
        "pgworker.job.type": "send-invoice",
        "pgworker.job.queue": "mail",
        "pgworker.job.correlation_id": "req-7",
        "pgworker.job.outcome": "completed",
    }
    assert attributes["messaging.system"] == "pgworker"
    assert attributes["messaging.destination.name"] == "mail"
    assert attributes["messaging.message.id"] == str(r.job.id)
    assert attributes["messaging.message.conversation_id"] == "req-7"
    assert attributes["pgworker.worker_id"]
    # Linked to the enqueuing span, and a root of its own trace.
    (link,) = span.links
    assert link.context.trace_id == request.get_span_context().trace_id
    assert link.context.span_id == request.get_span_context().span_id
    assert span.parent is None
    assert span.context.trace_id != request.get_span_context().trace_id
    assert span.status.status_code is StatusCode.UNSET
    # The handler ran inside it: its own span nests under it, and its enqueue links back.
    assert seen["current"].get_span_context() == span.context
    (charge,) = [s for s in spans.get_finished_spans() if s.name == "charge"]
    assert charge.parent.span_id == span.context.span_id
    assert charge.context.trace_id == span.context.trace_id
    (child,) = attempt_spans(spans, seen["child"])
    assert child.links[0].context.span_id == span.context.span_id
    assert seen["receipt"].get_span_context() == child.context
    assert child.attributes["pgworker.job.correlation_id"] == "req-7"  # inherited


@aio
async def test_a_failing_job_has_one_error_span_per_attempt_with_the_redacted_error(
    dsn, conn, spans
):
    registry = pgworker.Registry()

    @registry.task("login", retry=FAST)
    async def login(ctx: pgworker.JobContext, payload: Any) -> None:
        raise ValueError(f"login failed password={payload['password']}")

    r = await pgworker.enqueue(conn, "login", {"password": "hunter2"})
    async with pgworker.Worker(registry, dsn, poll_interval=0.02):
        await wait_for(lambda: all_finished(conn))
        await wait_for(lambda: len(attempt_spans(spans)) == 3)
    found = attempt_spans(spans, r.job.id)
    assert [s.attributes["pgworker.job.attempt"] for s in found] == [1, 2, 3]
    assert [s.attributes["pgworker.job.outcome"] for s in found] == ["retried", "retried", "failed"]
    error = f"ValueError: login failed password={REDACTED}"
    for s in found:
        assert s.status.status_code is StatusCode.ERROR
        assert s.status.description == error
        (event,) = s.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == error
        assert event.attributes["exception.stacktrace"].startswith("Traceback")
        assert "hunter2" not in json.dumps([dict(s.attributes), dict(event.attributes)])
        assert not s.links  # enqueued outside any span
    assert (await pgworker.get_job(conn, r.job.id)).status == "failed"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@aio
async def test_hostile_handlers_leave_the_spans_and_the_worker_sound(dsn, conn, spans):
    registry = pgworker.Registry()

    @registry.task("unprintable", max_retries=0)
    async def unprintable(ctx: pgworker.JobContext, payload: Any) -> None:
        raise Unprintable()

    @registry.task("self-cancel", max_retries=0)
    async def self_cancel(ctx: pgworker.JobContext, payload: Any) -> None:
        raise asyncio.CancelledError()

    @registry.task("leaves-context", max_retries=0)
    async def leaves_context(ctx: pgworker.JobContext, payload: Any) -> None:
        # Attaches a span and never detaches it, then ends the pgworker span itself.
        otel_context.attach(trace.set_span_in_context(trace.get_tracer("app").start_span("x")))
        trace.get_current_span().end()

    @registry.task("ok")
    async def ok(ctx: pgworker.JobContext, payload: Any) -> None:
        return None

    ids = [
        (await pgworker.enqueue(conn, kind, {})).job.id
        for kind in ("unprintable", "self-cancel", "leaves-context")
    ]
    async with pgworker.Worker(registry, dsn, concurrency=1, poll_interval=0.02):
        await wait_for(lambda: all_finished(conn))
        after = (await pgworker.enqueue(conn, "ok", {})).job.id
        await wait_for(lambda: all_finished(conn))
        await wait_for(lambda: attempt_spans(spans, after))
    unprintable_span = attempt_spans(spans, ids[0])[0]
    assert unprintable_span.status.status_code is StatusCode.ERROR
    assert unprintable_span.status.description.startswith("Unprintable")
    assert attempt_spans(spans, ids[1])  # its span ended too
    (last,) = attempt_spans(spans, after)
    assert last.parent is None  # what the hostile handler attached did not stay
    assert last.attributes["pgworker.job.outcome"] == "completed"
    assert (await pgworker.get_job(conn, after)).status == "completed"


class BrokenTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracer down")


class BrokenProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return BrokenTracer()


class RaisingProcessor(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        span.set_attribute("started", True)

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("exporter down")


@aio
@pytest.mark.parametrize("broken", ["tracer", "processor"])
async def test_a_broken_tracer_never_stops_the_jobs(dsn, conn, broken):
    if broken == "tracer":
        provider: Any = BrokenProvider()
    else:
        provider = TracerProvider()
        provider.add_span_processor(RaisingProcessor())
    _install(provider)
    try:
        registry = pgworker.Registry()

        @registry.task("t")
        async def handle(ctx: pgworker.JobContext, payload: Any) -> str:
            return "done"

        remote = trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(1))
        token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
        try:
            await pgworker.enqueue_many(conn, [JobSpec("t", {"n": i}) for i in range(5)])
        finally:
            otel_context.detach(token)
        async with pgworker.Worker(registry, dsn, concurrency=2, poll_interval=0.02):
            await wait_for(lambda: all_finished(conn))
    finally:
        _install(None)
    counts = await conn.fetch("SELECT status, count(*) FROM pgworker.jobs GROUP BY status")
    assert [(r["status"], r["count"]) for r in counts] == [("completed", 5)]


@aio
async def test_the_jobs_of_an_unsampled_request_are_traced_and_linked(dsn, conn, spans):
    registry = pgworker.Registry()

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: Any) -> None:
        return None

    remote = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(0))
    token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
    try:
        r = await pgworker.enqueue(conn, "t", {})
    finally:
        otel_context.detach(token)
    assert await stored(conn, [r.job.id]) == [f"00-{0xABC:032x}-{0xDEF:016x}-00"]
    async with pgworker.Worker(registry, dsn, poll_interval=0.02):
        await wait_for(lambda: attempt_spans(spans, r.job.id))
    (span,) = attempt_spans(spans, r.job.id)
    assert (span.links[0].context.trace_id, span.links[0].context.span_id) == (0xABC, 0xDEF)
    assert not span.links[0].context.trace_flags.sampled and span.context.trace_flags.sampled


@aio
async def test_the_recipe_traces_a_real_worker(dsn, conn, spans, tmp_path):
    """`pgworker run examples.recipes.tracing`: its console exporter prints the attempt's span,
    flushed when SIGTERM ends the worker."""
    with trace.get_tracer("web").start_as_current_span("POST /emails") as request:
        r = await pgworker.enqueue(conn, "send-email", {"to": "a@b.c"}, queue="mail")
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORKER_DSN", "DATABASE_URL")}
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "worker.log"
    out = tmp_path / "worker.out"
    worker = subprocess.Popen(
        [sys.executable, "-m", "pgworker", "run", "examples.recipes.tracing", "--dsn", dsn],
        stdout=out.open("wb"),
        stderr=log.open("wb"),
        env=env,
        cwd=ROOT,
    )
    try:
        await wait_for(lambda: all_finished(conn), timeout=30)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            assert worker.wait(timeout=30) == 0, log.read_text()
        finally:
            worker.kill()
    text, printed, at = out.read_text(), [], 0
    decoder = json.JSONDecoder()
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        span, at = decoder.raw_decode(text, at)
        printed.append(span)
    (span,) = [s for s in printed if s["name"] == "pgworker.job send-email"]
    assert span["attributes"]["pgworker.job.id"] == r.job.id
    assert span["attributes"]["pgworker.job.outcome"] == "completed"
    (link,) = span["links"]
    assert link["context"]["span_id"] == f"0x{request.get_span_context().span_id:016x}"


# --- off: no cost ----------------------------------------------------------------------------


@aio
async def test_without_a_provider_no_span_is_made_nor_left_current(dsn, conn, spans):
    """Tracing follows the global provider from job to job; an attempt's span is current while
    its handler runs and no longer after: the next job on the same slot, untraced, sees none."""
    registry = pgworker.Registry()
    current: list[Any] = []

    @registry.task("t")
    async def handle(ctx: pgworker.JobContext, payload: Any) -> None:
        current.append(trace.get_current_span())

    async with pgworker.Worker(registry, dsn, concurrency=1, poll_interval=0.02):
        await pgworker.enqueue(conn, "t", {"n": 1})
        await wait_for(lambda: all_finished(conn))
        _install(None)
        await pgworker.enqueue(conn, "t", {"n": 2})
        await wait_for(lambda: all_finished(conn))
    (traced,) = attempt_spans(spans)
    assert [s.get_span_context() for s in current] == [
        traced.context,
        trace.INVALID_SPAN.get_span_context(),
    ]
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert _tracing.start(AN_ATTEMPT, "w") is None


SCRIPT = """
import sys, anyio, asyncpg, pgworker

async def main(dsn):
    registry = pgworker.Registry()
    done = []

    @registry.task("t")
    async def handle(ctx, payload):
        done.append(payload)

    conn = await asyncpg.connect(dsn)
    await pgworker.enqueue(conn, "t", {"n": 1})
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("t", {"n": 2})])
    await pgworker.enqueue_many(conn, [pgworker.JobSpec("t", {"n": 3}, idempotency_key="k")])
    async with pgworker.Worker(registry, dsn, poll_interval=0.02):
        with anyio.fail_after(20):
            while len(done) < 3:
                await anyio.sleep(0.02)
    await conn.close()
    print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))

anyio.run(main, sys.argv[1])
"""


@aio
async def test_enqueue_and_the_worker_never_import_opentelemetry(dsn):
    with anyio.fail_after(60):
        out = await anyio.run_process([sys.executable, "-c", SCRIPT, dsn], cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().strip() == "[]"


def test_tracing_costs_one_lookup_when_opentelemetry_is_not_imported(monkeypatch):
    for name in ("opentelemetry.trace", "opentelemetry.context"):
        monkeypatch.delitem(sys.modules, name)
    assert _tracing.current_traceparent() is None
    assert _tracing.start(AN_ATTEMPT, "w") is None
