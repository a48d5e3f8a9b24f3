"""OpenTelemetry tracing: the W3C traceparent an enqueue stores, and one span per attempt.

Nothing here imports opentelemetry. An application that traces has imported it (to set its
TracerProvider, or through an instrumentation), so `sys.modules` says whether it is in use: when
it is not, an enqueue or an attempt pays one dictionary lookup. Tracing is on while the
application's global TracerProvider is a real one (not the API's proxy or no-op provider).

A span is a root of its own trace, linked to the enqueuing span rather than its child: an
attempt runs after the request that enqueued it has ended, maybe many times and days later, and
the worker samples its own traces. The span is the current one while the handler runs, so the
handler's spans (and the jobs it enqueues) nest under it. Its error texts are the redacted ones
the attempt stores; nothing here reads the handler's exception. A tracer that raises costs the
span, never the attempt.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import TYPE_CHECKING, Any

from ._logs import base_logger
from ._version import __version__
from .models import AttemptResult, Outcome

if TYPE_CHECKING:
    from ._attempt import Attempt

SPAN_NAME = "pgworker.job"
"""An attempt's span is named `pgworker.job <type>`."""

_FAILED = frozenset({Outcome.FAILED, Outcome.RETRIED, Outcome.TIMED_OUT})
"""The outcomes whose span has status ERROR: the handler failed (or ran out of time)."""

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_UNKNOWN = object()
_provider: Any = None
_tracer: Any = None
_warned = False


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None: no span, or OpenTelemetry unused."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    except Exception as exc:  # an application's span or context that misbehaves
        _warn("traceparent not stored: the current span cannot be read", exc)
        return None


def _tracer_now(trace: Any) -> Any:
    """pgworker's tracer from the global provider, or None while none is set. The API's own
    global is read first: `get_tracer_provider()` costs a microsecond (it looks up an
    environment variable on each call), a noticeable share of a no-op job."""
    global _provider, _tracer
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None:  # none set: the API's proxy would make spans that record nothing
        return None
    if provider is _UNKNOWN:  # an API that keeps it elsewhere
        provider = trace.get_tracer_provider()
    if provider is _provider:
        return _tracer
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        tracer = None
    else:
        tracer = provider.get_tracer("pgworker", __version__)
    _provider, _tracer = provider, tracer
    return tracer


def _link(trace: Any, traceparent: Any) -> list[Any]:
    """A link to the span that `traceparent` names; none when it is missing or malformed (the
    column can be written by anyone)."""
    if not isinstance(traceparent, str):
        return []
    found = _TRACEPARENT.fullmatch(traceparent)
    if found is None:
        return []
    trace_id, span_id = int(found[1], 16), int(found[2], 16)
    if not trace_id or not span_id:
        return []
    context = trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(int(found[3], 16))
    )
    return [trace.Link(context)]


class AttemptSpan:
    """An attempt's span, current from `start` until `end`."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Any, token: Any) -> None:
        self._span = span
        self._token = token

    def end(self, result: AttemptResult | None) -> None:
        """Record how the attempt ended (None: it did not, the worker stopped it) and close the
        span; the handler's context is left as it was before `start`."""
        if self._token is not None:
            try:
                sys.modules["opentelemetry.context"].detach(self._token)
            except Exception as exc:
                _warn("the attempt's tracing context could not be restored", exc)
        span = self._span
        try:
            if result is not None and span.is_recording():
                span.set_attribute("pgworker.job.outcome", result.outcome.value)
                if result.outcome in _FAILED:
                    _record_error(span, result)
        except Exception as exc:
            _warn("the attempt's span could not record its outcome", exc)
        try:
            span.end()
        except Exception as exc:
            _warn("the attempt's span could not be ended", exc)


def _record_error(span: Any, result: AttemptResult) -> None:
    trace = sys.modules["opentelemetry.trace"]
    error = f"{result.error_type}: {result.error_message}"
    event = {"exception.type": result.error_type or "", "exception.message": error}
    if result.error_detail:
        event["exception.stacktrace"] = result.error_detail
    span.add_event("exception", event)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error))


def start(attempt: Attempt, worker_id: str) -> AttemptSpan | None:
    """The attempt's span, made current; None when tracing is off or the tracer fails."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    try:
        tracer = _tracer_now(trace)
        if tracer is None:
            return None
        context = sys.modules["opentelemetry.context"]
        job_id, queue, correlation_id = attempt.id, attempt.queue, attempt.correlation_id
        span = tracer.start_span(
            f"{SPAN_NAME} {attempt.type}",
            context=context.Context(),  # a root: not a child of whatever started the worker
            kind=trace.SpanKind.CONSUMER,
            links=_link(trace, attempt.traceparent),
            attributes={
                "pgworker.job.id": job_id,
                "pgworker.job.attempt": attempt.number,
                "pgworker.job.type": attempt.type,
                "pgworker.job.queue": queue,
                "pgworker.job.correlation_id": correlation_id,
                "pgworker.worker_id": worker_id,
                "messaging.system": "pgworker",
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": str(job_id),
                "messaging.message.conversation_id": correlation_id,
            },
        )
    except Exception as exc:
        _warn("the attempt runs without a span: the tracer failed", exc)
        return None
    try:
        token = context.attach(trace.set_span_in_context(span))
    except Exception as exc:
        _warn("the attempt's span could not be made current", exc)
        token = None
    return AttemptSpan(span, token)


def _warn(event: str, exc: Exception) -> None:
    """One warning per process: a tracer that fails once fails for every job."""
    global _warned
    if _warned:
        return
    _warned = True
    with contextlib.suppress(Exception):
        base_logger().warning(event, error=f"{type(exc).__name__}: {_text(exc)}")


def _text(exc: Exception) -> str:
    try:
        return str(exc)[:200]
    except Exception:
        return "(its message cannot be read)"
