"""CPU time from /proc, in seconds: a process with its threads and live descendants; the
processes of one PostgreSQL server (its postmaster and every process under it: backends, WAL
writer, checkpointer, autovacuum, ...; other clusters on the machine are left out); this
process; and the whole machine. Counters are kept per process (pid and start time), so
processes that exit between two samples keep what they used and new ones add theirs: totals
never go back."""

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


def parent(pid: int) -> int | None:
    s = _stat(pid)
    return None if s is None else s[1]


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def _tree(root: int, stats: dict[int, tuple[str, int, int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in tree:
            continue
        tree.add(pid)
        todo.extend(children.get(pid, ()))
    return tree


class CpuMeter:
    """Accumulates the CPU of one process tree (`root`, the worker), of the PostgreSQL server
    whose postmaster is `postmaster` (minus the backends in `exclude`: the benchmark's own
    connections), of `side` (a pooler the benchmark started, or None), of this process's tree
    (without `side`), and of the machine."""

    def __init__(
        self,
        root: int | None = None,
        postmaster: int | None = None,
        exclude: set[int] | None = None,
    ) -> None:
        self.root = root
        self.postmaster = postmaster
        self.exclude = set(exclude or ())
        self.side: int | None = None
        self._side: dict[tuple[int, int], int] = {}
        self._worker: dict[tuple[int, int], int] = {}
        self._pg: dict[tuple[int, int], int] = {}
        self._self: dict[tuple[int, int], int] = {}

    def sample(self) -> tuple[float, float, float, float, float]:
        """(worker tree, PostgreSQL server, this benchmark process tree, whole machine busy,
        side tree) CPU seconds accumulated so far."""
        stats = {}
        for pid in _pids():
            s = _stat(pid)
            if s is not None:
                stats[pid] = s
        me = _tree(os.getpid(), stats)
        if self.root is not None:
            for pid in _tree(self.root, stats):
                _, _, ticks, start = stats[pid]
                self._worker[(pid, start)] = ticks
            me -= _tree(self.root, stats)
        if self.side is not None:
            for pid in _tree(self.side, stats):
                _, _, ticks, start = stats[pid]
                self._side[(pid, start)] = ticks
            me -= _tree(self.side, stats)
        for pid in me:
            _, _, ticks, start = stats[pid]
            self._self[(pid, start)] = ticks
        if self.postmaster is not None:
            server = _tree(self.postmaster, stats)
        else:
            server = {pid for pid, st in stats.items() if st[0] == "postgres"}
        for pid in server:
            _, _, ticks, start = stats[pid]
            if pid not in self.exclude:
                self._pg[(pid, start)] = ticks
        return (
            sum(self._worker.values()) / TICK,
            sum(self._pg.values()) / TICK,
            sum(self._self.values()) / TICK,
            machine_busy(),
            sum(self._side.values()) / TICK,
        )
