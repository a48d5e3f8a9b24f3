"""Tracing (README, Tracing): `pgworker run examples.recipes.tracing` serves the recipes' tasks
with every attempt traced. Needs `pip install 'pgworker-queue[otel]' opentelemetry-sdk`."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from examples.recipes.tasks import registry

# Once per process, at start-up: in the services that enqueue, and in the module the worker
# imports. In production, an OTLPSpanExporter (opentelemetry-exporter-otlp) instead.
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)

__all__ = ["registry"]
