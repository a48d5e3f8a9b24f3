"""Handlers whose errors and log lines carry terminal escape sequences, for tests/test_terminal.py
(`pgworker run tests.apps.terminal --log-format console`)."""

import pgworker

registry = pgworker.Registry()

HOSTILE = (
    "\x1b[2J\x1b[H"  # clear the screen
    "\x1b]0;owned\x07"  # set the window title
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # an OSC 8 link
    "\x9b2J"  # 8-bit CSI: clear the screen again
    "\rroot@prod:~# "  # a fake prompt over the line
    "\u202edesrever\x7f"  # a bidi override, DEL
)


@registry.task("hostile-error", max_retries=0)
async def hostile_error(ctx: pgworker.JobContext, payload: dict) -> None:
    ctx.log.info(f"about to fail {HOSTILE}", detail=HOSTILE)
    raise ValueError(f"boom {HOSTILE}\nsecond line {HOSTILE}")
