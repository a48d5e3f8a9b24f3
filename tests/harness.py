"""What the long runs (`make scale`, `make failover`, `make upgrade`) share: how a run ends.

A run raises Skip when this machine cannot run it (it then exits 0, saying why), Broken when a
promise did not hold; `arm` makes a stop signal raise Stopped and the run's budget raise Broken,
and `disarm`, in the run's clean-up, ignores the stop signals so that a second one cannot cut
that clean-up short."""

from __future__ import annotations

import signal

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
