"""Other processes' CPU use on a shared machine: a gate before a timed run and a count after it.

The peer measurements import this (it sits beside them; standard library only, Linux /proc):
`wait_for_idle` holds a timed run until the whole machine has been idle for a moment, and
`ForeignCpu` counts the CPU seconds that processes outside the measurement spent while it ran,
so a figure taken while something else was computing can be told apart from a clean one.
Processes that start and end inside the window are missed, so the count is a lower bound.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _busy_and_total() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def busy_fraction(seconds: float) -> float:
    """The share of all CPUs that was busy over the next `seconds`."""
    busy0, total0 = _busy_and_total()
    time.sleep(seconds)
    busy1, total1 = _busy_and_total()
    return (busy1 - busy0) / max(total1 - total0, 1)


def wait_for_idle(max_busy: float = 0.1, window: float = 2.0, timeout: float = 600.0) -> float:
    """Block until the machine was at most `max_busy` busy over `window` seconds; return the
    seconds waited. Raises TimeoutError after `timeout` seconds."""
    start = time.monotonic()
    while busy_fraction(window) > max_busy:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"the machine stayed busier than {max_busy:.0%} for {timeout:.0f} s")
    return time.monotonic() - start


def _snapshot() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, start time, CPU ticks) for every process readable now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is the state (stat field 3): ppid is field 4, utime 14, stime 15, start 22
        table[int(entry.name)] = (
            int(fields[1]),
            int(fields[19]),
            int(fields[11]) + int(fields[12]),
        )
    return table


def _tree(table: dict[int, tuple[int, int, int]], roots: set[int]) -> set[int]:
    members, grew = set(roots), True
    while grew:
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in members}
        grew = not children <= members
        members |= children
    return members


def pids_running(name: str) -> set[int]:
    """The processes whose command line contains `name` (to leave a server out of the count)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if name in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class ForeignCpu:
    """CPU seconds used, between `start()` and `stop()`, by processes outside this one's tree
    and outside the trees of `also_ours` (e.g. a server being measured)."""

    def __init__(self, also_ours: set[int] | None = None) -> None:
        self.roots = {os.getpid(), *(also_ours or set())}
        self.before: dict[int, tuple[int, int, int]] = {}

    def start(self) -> None:
        self.before = _snapshot()

    def stop(self) -> float:
        after = _snapshot()
        ours = _tree(after, self.roots) | _tree(self.before, self.roots)
        ticks = 0
        for pid, (_, started, used) in after.items():
            if pid in ours:
                continue
            earlier = self.before.get(pid)
            ticks += used - earlier[2] if earlier and earlier[1] == started else used
        return ticks / TICK
