"""Emitting an event (`pgworker.emit`): what wakes the jobs waiting for it in
`ctx.wait_for_event` (see _steps.py and docs/guide/events.md). The SQL function `emit` of
migration 0020 does the work, in the caller's transaction; this checks the arguments first, as
enqueue does, so that a bad one writes nothing."""

from __future__ import annotations

from typing import Any

from . import _validate as validate
from ._db.connection import Executor
from ._db.queries import queries
from ._drivers import NATIVE, UNUSABLE, adapt, unusable
from ._payloads import json_text
from .models import DEFAULT_SCHEMA


def event_data(value: Any) -> str | None:
    """An event's data as JSON text (None: no data), or a ValidationError naming `data`."""
    if value is None:
        return None
    return json_text("data", value, "", "nothing was emitted")


async def emit(
    conn: Executor | Any, name: str, data: Any = None, *, schema: str = DEFAULT_SCHEMA
) -> int:
    """Emit event `name` with `data` (JSON-serialisable, or None): every job waiting for it in
    `ctx.wait_for_event` gets `data` and runs again at once, and the event is kept for the
    waits that come later (each job consumes an event once: see docs/guide/events.md). Returns
    how many waiting jobs it woke. On a Connection inside a transaction, in that transaction:
    nothing is delivered unless it commits. `conn` is what `enqueue` takes. A bad name (empty,
    over 200 characters, NUL) or data raises ValidationError, nothing written."""
    name = validate.event_name(name)
    text = event_data(data)
    if conn.__class__ not in NATIVE:
        conn = adapt(conn)
    q = queries(validate.identifier("schema", schema))
    try:
        return await q.event_emit(conn, name, text)
    except UNUSABLE as exc:
        error = unusable(conn, exc)
        if error is None:
            raise
        raise error from exc
