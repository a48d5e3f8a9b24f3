"""A pgworker task with a limit, for `python -m bench.herd --type noop-capped`: no
other task, so that every claim the fleet makes is a limited one."""

from __future__ import annotations

import pgworker

registry = pgworker.Registry()


@registry.task("noop-capped", max_running=5)
async def noop_capped(ctx: pgworker.JobContext, payload: dict) -> None:
    return None
