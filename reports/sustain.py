"""The highest load each strategy sustains, by the harness's one SLO rule, as the knee search
estimates it.

A run sustains its load when at least `slo.attainment` of its requests meet every configured
limit, latencies from arrival, failed requests counted as misses (`harness.measure.slo`; the
run's summary records its verdict). Across a sweep's loads, each strategy's knee is
fitted by the search's own estimator (`harness.search.estimator.fit_knee`) on every complete
run's requests: where the `slo.attainment`-quantile of their SLO ratios crosses 1 in load,
with a 95% interval from as many independent draws as the requests stand for, so a sweep
and a search say the same of the same runs. A walk that stops at the first failing run
reads one run's luck as the knee (a pass above a failure, or a failure of a run whose
requests meet the SLO nine times in ten when rerun); the interval says how far a sweep's
runs bound it.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.harness.measure.slo.limits import SLO
from servelab.harness.search.estimator import Knee, fit_knee
from servelab.harness.search.probe_ratios import probe_ratios
from servelab.reports.grouping import Group


@dataclass(frozen=True)
class Sustained:
    """One strategy's knee in one group, fitted on its runs at the loads `tested`."""

    label: str
    knee: Knee
    tested: tuple[float, ...]


def group_slo(group: Group) -> SLO | None:
    """The group's SLO when it has a limit to judge by."""
    slo = SLO.of_record(group.slo)
    return slo if slo is not None and slo.configured else None


CONFIDENCE = 0.95  # of each knee's interval, as the search's (`search.confidence`)


def sustained_loads(group: Group) -> list[Sustained]:
    """Per strategy in the group, its knee (empty without an SLO or x axis)."""
    slo = group_slo(group)
    if slo is None or group.x_kind == "none":
        return []
    found = []
    for label in group.labels:
        runs = [
            r
            for r in group.runs
            if r.label == label and r.x is not None and r.run.complete and r.run.request_records
        ]
        probes = [probe_ratios(r.x, r.run.request_records, slo) for r in runs]
        if probes:
            knee = fit_knee(probes, slo.attainment, CONFIDENCE)
            found.append(Sustained(label, knee, tuple(sorted({r.x for r in runs if r.x}))))
    return found
