"""Handlers served by `pgworker run tests.apps.defs` in test_def_handlers.py: `loop`, a plain def
that records a step, then works until the worker asks it to stop, and returns."""

import time

import pgworker

registry = pgworker.Registry()


@registry.task("loop")
def loop(ctx: pgworker.JobContext, payload: dict) -> dict:
    ctx.step("started", lambda: "started")
    ctx.progress("looping")
    rounds = 0
    started = time.monotonic()
    while not ctx.stopping.wait(0.05):
        rounds += 1
    return {"rounds": rounds, "stopped": ctx.stopped, "waited_s": time.monotonic() - started}
