"""CPU time from /proc, in seconds: a process with its threads and live descendants, and every
PostgreSQL server process. Counters are kept per process (pid and start time), so processes that
exit between two samples keep what they used and new ones add theirs: totals never go back."""

from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(comm, ppid, utime+stime in ticks, starttime) of one process, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    lpar, rpar = raw.find("("), raw.rfind(")")
    comm = raw[lpar + 1 : rpar]
    fields = raw[rpar + 2 :].split()
    # fields[0] is field 3 (state) of proc(5): ppid=4, utime=14, stime=15, starttime=22.
    return comm, int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


class CpuMeter:
    """Accumulates the CPU of one process tree (`root`) and of all `postgres` processes, minus
    the backends in `exclude` (the benchmark's own connections)."""

    def __init__(self, root: int | None = None, exclude: set[int] | None = None) -> None:
        self.root = root
        self.exclude = set(exclude or ())
        self._worker: dict[tuple[int, int], int] = {}
        self._pg: dict[tuple[int, int], int] = {}

    def sample(self) -> tuple[float, float]:
        """Return (worker tree CPU s, PostgreSQL CPU s) accumulated so far."""
        stats = {}
        for pid in _pids():
            s = _stat(pid)
            if s is not None:
                stats[pid] = s
        if self.root is not None:
            tree = {self.root}
            grew = True
            while grew:
                grew = False
                for pid, (_, ppid, _, _) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree:
                if pid in stats:
                    _, _, ticks, start = stats[pid]
                    self._worker[(pid, start)] = ticks
        for pid, (comm, _, ticks, start) in stats.items():
            if comm == "postgres" and pid not in self.exclude:
                self._pg[(pid, start)] = ticks
        return sum(self._worker.values()) / TICK, sum(self._pg.values()) / TICK
