"""Handlers for the poison tests (`pgworker run tests.apps.poison`)."""

import os
import threading
import time
from pathlib import Path
from typing import Any

import anyio

import pgworker

registry = pgworker.Registry()


@registry.task("work")
async def work(ctx: pgworker.JobContext, payload: dict) -> dict:
    await anyio.sleep(payload.get("ms", 0) / 1000)
    return {"n": payload.get("n")}


@registry.task("forever-sync")
def forever_sync(ctx: pgworker.JobContext, payload: dict) -> None:
    """A plain `def` handler that never returns: its thread cannot be stopped."""
    threading.Event().wait()


@registry.task("mail-only", queue="mail")
async def mail_only(ctx: pgworker.JobContext, payload: dict) -> str:
    return "sent"


# --- freeze points of the maintenance leader (test N) ---------------------------------------
# With POISON_FREEZE_DIR set, the test arms a point of the leader's cycle by writing its name to
# `armed` in that directory. The leader that reaches it takes the file (renamed to `reached`),
# writes its process id to `pid` and waits there until the test removes `reached`: meanwhile the
# test freezes the whole process (SIGSTOP), exactly at that point, and lets it go on (SIGCONT).
FREEZE_DIR = os.environ.get("POISON_FREEZE_DIR")

if FREEZE_DIR:
    from pgworker._db.queries import Queries
    from pgworker._maintenance.leader import Leader
    from pgworker._runtime.leadership import Leadership

    def _take(point: str) -> bool:
        """Whether `point` is armed and this process took it (then says its id)."""
        armed = Path(FREEZE_DIR, "armed")
        try:
            if armed.read_text() != point:
                return False
            armed.rename(Path(FREEZE_DIR, "reached"))  # atomic: one process takes it
        except FileNotFoundError:
            return False
        Path(FREEZE_DIR, "pid.tmp").write_text(str(os.getpid()))
        Path(FREEZE_DIR, "pid.tmp").rename(Path(FREEZE_DIR, "pid"))
        return True

    def _wait_released() -> None:
        while Path(FREEZE_DIR, "reached").exists():
            time.sleep(0.005)

    async def _barrier(point: str) -> None:
        if _take(point):
            await anyio.to_thread.run_sync(_wait_released)

    _renew = Leadership.renew

    async def _renew_then_freeze(self: Leadership) -> bool:
        leading = await _renew(self)
        if leading:
            await _barrier("renewed")
        return leading

    _expired = Queries.jobs_expired

    async def _expired_then_freeze(self: Queries, *args: Any, **kwargs: Any) -> Any:
        found = await _expired(self, *args, **kwargs)
        await _barrier("expired")  # about to rescue what it found
        return found

    _idle = Leader.idle

    async def _freeze_then_idle(self: Leader) -> None:
        if self._leadership.leading:
            await _barrier("idle")
        await _idle(self)

    Leadership.renew = _renew_then_freeze  # type: ignore[method-assign]
    Queries.jobs_expired = _expired_then_freeze  # type: ignore[method-assign]
    Leader.idle = _freeze_then_idle  # type: ignore[method-assign]
