"""The highest load each strategy sustains, by the harness's one SLO rule.

A run sustains its load when at least `slo.attainment` of its requests meet every configured
limit, latencies from arrival, failed requests counted as misses (`harness.measure.slo`):
the run's summary records the verdict, and a run without a summary is judged from its
records by the same rule. A strategy sustains load x when its runs at x and at every lower
tested load do; a pass above a failure does not count, so noise cannot overstate capacity.
The first failing load is reported too: the knee lies between the two.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.harness.measure.slo.limits import SLO
from servelab.reports.derive import slo_attainment
from servelab.reports.grouping import Group, SweepRun


def run_sustains(sweep_run: SweepRun, slo: SLO) -> bool | None:
    """Whether the run sustains its load; None when it cannot be judged."""
    run = sweep_run.run
    verdict = (run.summary or {}).get("sustained")
    if isinstance(verdict, bool):
        return verdict
    if not run.request_records:
        return None
    return slo.sustains(slo_attainment(run.request_records, slo))


@dataclass(frozen=True)
class Sustained:
    """The highest sustained load of one strategy in one group, and the first it failed."""

    label: str
    load: float | None
    first_failed: float | None  # None: every tested load passed
    tested: tuple[float, ...]

    @property
    def all_passed(self) -> bool:
        return self.first_failed is None


def highest_sustained(label: str, results: list[tuple[float, bool | None]]) -> Sustained:
    """Walk loads upwards; stop at the first load where any run fails or cannot be judged."""
    loads = sorted({x for x, _ in results})
    best: float | None = None
    for load in loads:
        verdicts = [passed for x, passed in results if x == load]
        if not all(v is True for v in verdicts):
            return Sustained(label, best, load, tuple(loads))
        best = load
    return Sustained(label, best, None, tuple(loads))


def group_slo(group: Group) -> SLO | None:
    """The group's SLO when it has a limit to judge by."""
    slo = SLO.of_record(group.slo)
    return slo if slo is not None and slo.configured else None


def sustained_loads(group: Group) -> list[Sustained]:
    """Per strategy in the group, its highest sustained load (empty without an SLO or x axis)."""
    slo = group_slo(group)
    if slo is None or group.x_kind == "none":
        return []
    found = []
    for label in group.labels:
        results = [
            (r.x, run_sustains(r, slo))
            for r in group.runs
            if r.label == label and r.x is not None and r.run.complete
        ]
        if results:
            found.append(highest_sustained(label, results))
    return found
