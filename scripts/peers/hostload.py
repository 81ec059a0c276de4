"""Other processes' CPU use on a shared machine: a gate before a timed run and a count after it.

The peer measurements import this (it sits beside them; standard library only, Linux /proc):
`wait_for_idle` holds a timed run until the machine has been idle for a moment, and
`ForeignCpu` counts the CPU seconds that processes outside the measurement spent while it ran,
so a figure taken while something else was computing can be told apart from a clean one.
Niced work (background jobs that yield to a timed run) does not count as busy for the gate,
else the gate never opens on a machine that always has some; the count reports it apart.
Processes that start and end inside the window are missed, so the count is a lower bound.

As a command it wraps one timed unit (scripts/peers/sweep.sh runs each server this way):

    python3 scripts/peers/hostload.py --out FILE [--quiet-wait S] [--max-busy F] -- CMD [ARG ...]

waits up to --quiet-wait seconds (default 0: no wait) for the machine to be at most
--max-busy (default 0.1) busy outside niced work, runs CMD, and writes to FILE a JSON object:
the command, its exit status, wall seconds, seconds waited and whether idle was reached, the
CPU seconds processes outside CMD's tree used meanwhile (`foreign_cpu_s`, of which
`foreign_niced_cpu_s` at a positive nice value) and the load average before and after. It
exits with CMD's status. It adopts CMD's orphaned descendants (a server still stopping after
its script has exited), so their CPU is not counted as another process's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def _busy_and_total() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[1] + fields[3] + fields[4]  # nice + idle + iowait
    total = sum(fields[:8])  # guest time is already inside user
    return total - idle, total


def busy_fraction(seconds: float) -> float:
    """The share of all CPUs that was busy outside niced work over the next `seconds`."""
    busy0, total0 = _busy_and_total()
    time.sleep(seconds)
    busy1, total1 = _busy_and_total()
    return (busy1 - busy0) / max(total1 - total0, 1)


def wait_for_idle(max_busy: float = 0.1, window: float = 2.0, timeout: float = 600.0) -> float:
    """Block until the machine was at most `max_busy` busy (niced work aside) over `window`
    seconds; return the seconds waited. Raises TimeoutError after `timeout` seconds."""
    start = time.monotonic()
    while busy_fraction(window) > max_busy:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"the machine stayed busier than {max_busy:.0%} for {timeout:.0f} s")
    return time.monotonic() - start


def add_quiet_arguments(parser: argparse.ArgumentParser, before: str) -> None:
    """The idle gate's options, as every timed peer script offers them."""
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help=f"before {before}, wait up to this many seconds for the machine to be idle",
    )
    parser.add_argument("--max-busy", type=float, default=0.1, help="idle means below this share")


def quiet_wait(args: argparse.Namespace, program: str) -> float:
    """Wait as `--quiet-wait` / `--max-busy` ask (not at all by default); the seconds waited.
    A machine that never quietens is warned about and timed anyway."""
    if not args.quiet_wait:
        return 0.0
    try:
        return wait_for_idle(args.max_busy, timeout=args.quiet_wait)
    except TimeoutError as error:
        print(f"{program}: warning: {error}; timing anyway", file=sys.stderr)
        return args.quiet_wait


def _snapshot() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (parent pid, start time, CPU ticks, nice) for every process readable now."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        # fields[0] is the state (stat field 3): ppid is field 4, utime 14, stime 15, nice 19,
        # start 22
        table[int(entry.name)] = (
            int(fields[1]),
            int(fields[19]),
            int(fields[11]) + int(fields[12]),
            int(fields[16]),
        )
    return table


def _tree(table: dict[int, tuple[int, int, int, int]], roots: set[int]) -> set[int]:
    members, grew = set(roots), True
    while grew:
        children = {pid for pid, (ppid, *_) in table.items() if ppid in members}
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
    and outside the trees of `also_ours` (e.g. a server being measured); `stop()` returns them
    and leaves the part spent at a positive nice value in `niced_s`."""

    def __init__(self, also_ours: set[int] | None = None) -> None:
        self.roots = {os.getpid(), *(also_ours or set())}
        self.before: dict[int, tuple[int, int, int, int]] = {}
        self.niced_s = 0.0

    def start(self) -> None:
        self.before = _snapshot()

    def stop(self) -> float:
        after = _snapshot()
        ours = _tree(after, self.roots) | _tree(self.before, self.roots)
        ticks = niced = 0
        for pid, (_, started, used, nice) in after.items():
            if pid in ours:
                continue
            earlier = self.before.get(pid)
            spent = used - earlier[2] if earlier and earlier[1] == started else used
            ticks += spent
            niced += spent if nice > 0 else 0
        self.niced_s = niced / TICK
        return ticks / TICK


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants: a server that outlives the script
    that started it (stopping in the background) stays in this tree instead of passing to
    init, where `ForeignCpu` would count its CPU as another process's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def main() -> int:
    parser = argparse.ArgumentParser(description="Run CMD as one timed unit; record the load.")
    parser.add_argument("--out", type=Path, required=True, help="JSON written here")
    parser.add_argument("--quiet-wait", type=float, default=0.0, help="seconds; default 0")
    parser.add_argument("--max-busy", type=float, default=0.1, help="default 0.1")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    waited_s, idle = 0.0, True
    if args.quiet_wait > 0:
        try:
            waited_s = wait_for_idle(args.max_busy, timeout=args.quiet_wait)
        except TimeoutError as error:
            print(f"hostload: warning: {error}; running anyway", file=sys.stderr)
            waited_s, idle = args.quiet_wait, False
    adopt_orphans()
    others = ForeignCpu()
    load_before = os.getloadavg()
    others.start()
    start = time.perf_counter()
    status = subprocess.call(command)
    wall_s = time.perf_counter() - start
    foreign_s = others.stop()
    record = {
        "command": command,
        "exit_status": status,
        "wall_s": round(wall_s, 1),
        "waited_for_idle_s": round(waited_s, 1),
        "idle_reached": idle,
        "foreign_cpu_s": round(foreign_s, 1),
        "foreign_niced_cpu_s": round(others.niced_s, 1),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
