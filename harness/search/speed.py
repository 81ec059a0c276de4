"""Each probe judged at the machine's speed of its own time, not at the search's start.

A shared machine's speed moves by tens of percent within a search, and the SLO was scaled
at its start: a probe run while the machine was 20% slower sees every latency 20% longer
and a capacity 20% lower, and read as it stands it moves its strategy's knee by the drift
(one strategy probed in a slow minute, another in a fast one, and their ratio carries it).
Every run of the engine in this process marks the machine's speed before and after itself
(`measure.speed_mark`); against the search's reference mark (its reference floor run's, where
the SLO was scaled), a probe at speed s relative to it (s = reference mark / the probe's)
served what a load of rate / s would have at the reference speed, each latency s times as
long, so its requests count at rate / s with SLO ratios times s (`ProbeRatios.at_speed`).
Knees are then rates at the reference speed, and a ratio of two knees is free of the drift.

A mark is not the speed exactly: the two marks of one probe (before and after) disagree by
the mark's own scatter and by what the speed moved during the probe. Every knee's interval
is widened by the 95% bound of a probe's mark error that those disagreements show
(`Speeds.uncertainty`), far less than the drift itself. A search with a probe unmarked (a
peer server, a simulated run) cannot judge that probe so, and widens by the drift between
the reference floor runs before and after instead (`knee.widened_for_drift`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from servelab.harness.measure.speed_mark import SpeedMark
from servelab.harness.search.ratio_knee import ProbeRatios

Z95 = 1.96  # two-sided 95% of a normal log error


@dataclass
class Speeds:
    """The search's reference mark and every probe's speed against it."""

    reference_s: float | None = None  # None until the first marked run
    speeds: list[float] = field(default_factory=list)  # each marked probe's, in order
    disagreements: list[float] = field(default_factory=list)  # log(after / before) each
    unmarked: int = 0  # probes without marks (judged as they ran)

    def judged(self, ratios: ProbeRatios, mark: SpeedMark | None) -> tuple[ProbeRatios, float]:
        """The probe's requests at the reference speed, and its speed (1 where unmarked; the
        first mark seen is the reference where none was set)."""
        if mark is None:
            self.unmarked += 1
            return ratios, 1.0
        if self.reference_s is None:
            self.reference_s = mark.seconds
        speed = self.reference_s / mark.seconds
        self.speeds.append(speed)
        self.disagreements.append(math.log(mark.after_s / mark.before_s))
        return ratios.at_speed(speed), speed

    @property
    def judged_all(self) -> bool:
        """Whether every probe was judged at its own speed."""
        return self.unmarked == 0 and bool(self.speeds)

    @property
    def uncertainty(self) -> float:
        """The factor (>= 1) a knee is widened by for its probes' mark errors: each probe's
        mark (the mean of two logs) is off by about half their disagreement's scatter."""
        if len(self.disagreements) < 2:
            return 1.0
        scatter = math.sqrt(statistics.fmean(d * d for d in self.disagreements))
        return math.exp(Z95 * scatter / 2)

    def to_json(self) -> dict:
        return {
            "reference_mark_s": self.reference_s,
            "speed_range": [min(self.speeds), max(self.speeds)] if self.speeds else None,
            "unmarked_probes": self.unmarked,
            "widened_by": self.uncertainty if self.judged_all else None,
        }

    def line(self) -> str:
        """What the judging did, in one line."""
        low, high = min(self.speeds), max(self.speeds)
        return (
            f"each probe judged at the machine's speed of its own time (marked before and after "
            f"it): from {low:.3g}x to {high:.3g}x the reference floor's; each knee's interval "
            f"widened x{self.uncertainty:.3g} for the marks' own scatter"
        )
