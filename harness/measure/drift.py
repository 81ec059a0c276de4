"""A speed measured twice on this machine, before some work and after it: how far it moved.

A shared VM's speed moves by tens of percent within minutes, and every figure taken in
between carries the move without showing it. The step profiler (`profile-steps`: the grid's
first shape timed again after the last) and the knee search (the scaled SLO's reference floor
run again after the last probe) each measure one and say it, flagged past `DRIFT_LIMIT`.
"""

from __future__ import annotations

from dataclasses import dataclass

DRIFT_LIMIT = 0.10  # a move past which what was measured in between met two speeds


@dataclass(frozen=True)
class Drift:
    before_s: float  # the time measured before the work
    after_s: float  # the same measured after it

    @property
    def change(self) -> float:
        return self.after_s / self.before_s - 1

    @property
    def factor(self) -> float:
        """The move as a factor of at least 1, whichever way it went."""
        ratio = self.after_s / self.before_s
        return max(ratio, 1 / ratio)

    @property
    def too_large(self) -> bool:
        return abs(self.change) > DRIFT_LIMIT

    def to_json(self) -> dict:
        return {"before_s": self.before_s, "after_s": self.after_s, "change": self.change}
