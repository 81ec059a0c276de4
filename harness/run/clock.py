"""A run's clock: seconds since the run's time 0, which a replay may move past a span in which
nothing was in flight (`replay.skip_idle`).

A probe at a low rate spends most of its time waiting: a strategy whose knee lies far below
one request a second is idle for most of each probe near it, and a knee there takes hours of
such probes to bracket. With no
request in flight and none in the inbox, the engine holds no state that time changes: the
next request finds it as it would after the wait. So the replay may jump the clock to the
next arrival instead of sleeping until it. Every timestamp stays on this clock, so arrivals
keep their schedule, every latency still starts at its request's arrival, and the run's
duration and throughput are those of the workload's rate; what the jump leaves out is only
the machine's own idle (caches and clocks cooling), and the run says how much it skipped.

A simulated run's clock is virtual and jumps over idle spans whatever the setting; with it,
the simulated replay notes those jumps in this clock's `skipped`, so that a simulated probe
says, and a search costs, what a real one skipping would.
"""

from __future__ import annotations

import math
import time


class RunClock:
    """`clock()` is the run's time in seconds; `skip_to` moves it forward without waiting."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.skipped: list[tuple[float, float]] = []  # (from, to) of every span skipped

    def __call__(self) -> float:
        return time.perf_counter() - self._start

    def zero(self) -> None:
        """Make now the run's time 0 (the replay starts; what came before was start-up)."""
        self._start = time.perf_counter()
        self.skipped.clear()

    def skip_to(self, when: float) -> None:
        """Jump to `when` if it is later than now; the span is kept in `skipped`."""
        now = self()
        if when > now:
            self._start -= when - now
            self.skipped.append((now, when))

    @property
    def skipped_s(self) -> float:
        return math.fsum(end - begin for begin, end in self.skipped)  # the same on every Python
