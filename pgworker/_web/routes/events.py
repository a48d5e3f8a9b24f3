"""POST /events/{name}: an event emitted (pgworker.emit), waking the jobs that wait for it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Body, Path, Response

from ..._events import emit
from ..answers import Emitted, answer
from ..schemas import EventData, EventName
from .common import Served
from .common import router as make_router

router = make_router("events")


# `{name:text}`: an event's name may hold any character, a `/` (sent as %2F) too.
@router.post(
    "/events/{name:text}",
    response_model=Emitted,
    response_description="the event, and how many jobs it woke",
)
async def emit_event(
    name: Annotated[EventName, Path(description="the event's name, URL-encoded")],
    api: Served,
    data: Annotated[EventData, Body()] = None,
) -> Response:
    """Emit an event (pgworker.emit): every job waiting for it in `ctx.wait_for_event` gets
    the body as its data and runs again at once, and the event is kept for the waits that
    come later (docs/guide/events.md). 200 with `name` and `woken`, how many waiting jobs
    it woke, answered before the emit commits."""
    async with api.transaction() as conn:
        woken = await emit(conn, name, data, schema=api.schema)
        return answer({"name": name, "woken": woken})
