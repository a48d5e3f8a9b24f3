"""What the long runs (`make scale`, `make failover`, `make upgrade`) share: how a run ends, and
how it waits for what it expects.

A run raises Skip when this machine cannot run it (it then exits 0, saying why), Broken when a
promise did not hold; `arm` makes a stop signal raise Stopped and the run's budget raise Broken,
and `disarm`, in the run's clean-up, ignores the stop signals so that a second one cannot cut
that clean-up short."""

from __future__ import annotations

import asyncio
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Skip(Exception):
    """This machine cannot run the test; the message says why."""


class Broken(Exception):
    """A promise did not hold; the message says which and how."""


class Stopped(Exception):
    """A signal asked the run to stop."""


def _stop(signum: int, frame: object) -> None:
    disarm()
    raise Stopped(signal.Signals(signum).name)


def arm(budget: int) -> None:
    """Stop signals raise Stopped; `budget` seconds from now, Broken."""

    def out_of_time(signum: int, frame: object) -> None:
        raise Broken(f"the run passed its {budget} s budget")

    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(budget)


def disarm() -> None:
    """No budget any more, and the stop signals ignored: the clean-up runs to its end."""
    signal.alarm(0)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def ended(exc: Exception) -> str:
    """What a run that raised `exc` failed with (Skip is the caller's: it is no failure): a
    broken promise or a stop as it says, the harness's own trouble with its traceback printed."""
    if isinstance(exc, Broken):
        return str(exc)
    if isinstance(exc, Stopped):
        return f"stopped by {exc}"
    traceback.print_exc()
    return f"{type(exc).__name__}: {exc}"


async def wait_until(
    what: str, check: Callable[[], Awaitable[Any]], timeout: float, every: float = 0.1
) -> Any:
    """Poll the coroutine function `check` until it returns something truthy; Broken after
    `timeout` seconds, naming `what` did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Broken(f"{what}: not within {timeout:.0f} s")
        await asyncio.sleep(every)
