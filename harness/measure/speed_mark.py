"""This machine's speed at one moment, in one number: the median time of a fixed product
shaped like a decode step's linear (8 rows through a 2048 x 2048 fp32 weight) on the run's
device, so memory traffic and compute both count. On a CPU it runs on one thread: a core's
speed is what a shared machine's drift moves, while a thread pool's wake-up after other work
scattered two-thread marks by 10-30% around one run on a 2-core VM (one thread: 2-3%).

A shared machine's speed moves by tens of percent within minutes (`measure.drift`). Every run
of the engine in this process marks it just before its clock starts and again after its last
request (`runs.run`, the summary's `speed_mark`), so a figure taken between can be read at
the speed of its own time: the knee search judges each probe so (`search.speed`), against the
speed its SLO was scaled at. Only the ratio of two marks on one machine means anything.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from servelab.harness.measure.calibrate import timed

ROWS, SIDE = 8, 2048  # the product's shape: a decode batch through one square weight
REPEATS = 64  # timed products per mark; their median is the mark (about 0.1 s on a CPU)


@dataclass(frozen=True)
class SpeedMark:
    """A run's marks: just before its clock started and after its last request."""

    before_s: float
    after_s: float

    @property
    def seconds(self) -> float:
        """The run's mark: the geometric mean of its two."""
        return (self.before_s * self.after_s) ** 0.5

    def to_json(self) -> dict:
        return {"before_s": self.before_s, "after_s": self.after_s}

    @classmethod
    def of_summary(cls, summary: dict) -> SpeedMark | None:
        """A run summary's marks; None where the run took none (no engine in this process)."""
        marks = summary.get("speed_mark") or {}
        before, after = marks.get("before_s"), marks.get("after_s")
        if not all(isinstance(v, int | float) and v > 0 for v in (before, after)):
            return None
        return cls(float(before), float(after))


def speed_mark_s(device: torch.device) -> float:
    """The median seconds of `REPEATS` products of the fixed shape on `device` (one thread
    on a CPU), after one untimed."""
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(ROWS, SIDE, generator=generator).to(device)
    weight = torch.randn(SIDE, SIDE, generator=generator).to(device)
    out = torch.empty(ROWS, SIDE, device=device)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        torch.matmul(rows, weight, out=out)
        return statistics.median(
            timed(lambda: torch.matmul(rows, weight, out=out), device) for _ in range(REPEATS)
        )
    finally:
        torch.set_num_threads(threads)
