"""Served by `pgworker run tests.apps.periodic` in tests/test_periodic_fleet.py: three one-second
schedules of one task, one per catch_up policy. The handler returns the slot it was given."""

import pgworker

registry = pgworker.Registry()


@registry.task("tick")
async def tick(ctx: pgworker.JobContext, payload: dict) -> dict:
    assert ctx.scheduled_at is not None and ctx.scheduled_at == ctx.job.scheduled_at
    return {"slot": ctx.scheduled_at.isoformat(), "policy": payload["policy"]}


for policy in ("latest", "all", "none"):
    registry.periodic(
        tick, every=1, name=f"tick-{policy}", catch_up=policy, payload={"policy": policy}
    )
