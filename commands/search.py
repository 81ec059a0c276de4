"""`servelab search`: each strategy's knee, the highest rate it sustains under the SLO, as an
interval found on this machine. The search is `harness.search.knee_search` (its probes and
budget `harness.search.strategy_search`, where each probe goes `harness.search.policy`, its
estimator `harness.search.estimator`); this file prints
its plan, each probe as it ends, and the knees and their ratios at the end."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.harness.run.compose import compose
from servelab.harness.search.estimator import knee_ratio
from servelab.harness.search.knee_search import search
from servelab.harness.search.probe_ratios import ProbeQuantile
from servelab.harness.search.probes import Probe
from servelab.harness.search.result import StrategyResult
from servelab.harness.search.text import knee_text, rate_text
from servelab.reports.search_report import answer_lines, predicted_text

SUMMARY = "each strategy's knee: the highest rate it sustains under the SLO, as an interval"
USAGE = """usage: servelab search [search.strategies=[a,b]] slo.ttft_s=S ... [OVERRIDE ...]

For every strategy: a floor probe (one request at a time), a ceiling probe (every request at
once), then Poisson rates where the knee's interval narrows most, until it is within
search.resolution, all within search.budget_s; the knee where the SLO's attainment share
(a quantile) of the requests' SLO ratios crosses 1."""


def probe_line(strategy: str, probe: Probe) -> str:
    """One line for a probe as it ends: what ran, its ratio quantile and its interval."""
    spec, outcome = probe.spec, probe.outcome
    what = {"floor": "one at a time", "ceiling": "all at once"}.get(spec.kind)
    ratios, throughput = outcome.ratios, outcome.request_throughput
    return (
        f"  {strategy}: {what or f'{spec.rate:.3g} req/s'}, {spec.requests} requests: "
        f"{quantile_text(probe.quantile)}, {ratios.met}/{len(ratios.ratios)} met the SLO"
        + (" (stopped early)" if outcome.stopped else "")
        + (f", {throughput:.3g} req/s served" if spec.kind == "ceiling" and throughput else "")
        + f" ({outcome.seconds:.0f} s"
        + (f", {outcome.idle_skipped_s:.3g} s idle skipped" if outcome.idle_skipped_s else "")
        + ")"
    )


def quantile_text(quantile: ProbeQuantile) -> str:
    """A probe's ratio quantile, e.g. "ratio q 0.83 [0.71, 1.02]", "... rising: over capacity"."""
    low, high = (f"{v:.3g}" if math.isfinite(v) else "inf" for v in (quantile.low, quantile.high))
    at_least = "" if quantile.known else ">= "
    return f"ratio q {at_least}{quantile.quantile:.3g} [{low}, {high}]" + (
        ", rising: over capacity" if quantile.over_capacity else ""
    )


def render_search(knees: list[StrategyResult]) -> str:
    table = Table(title="sustained request rate: where the SLO ratios' quantile crosses 1")
    for column in ("strategy", "predicted", "ceiling", "knee", "rate probes", "note"):
        table.add_column(column)
    for knee in knees:
        probes = ", ".join(
            f"{p.spec.rate:.3g}x{p.spec.requests}:{p.quantile.quantile:.2g}"
            + ("^" if p.quantile.over_capacity else "")
            for p in knee.rate_probes
        )
        found = "-" if knee.fit is None else knee_text(knee.fit)
        note = knee.note or ("" if knee.resolved else "not within the resolution")
        table.add_row(
            knee.strategy, predicted_text(knee), rate_text(knee.ceiling), found, probes, note
        )
    ratios = Table(title="sustained-rate ratios: the knees' ratio, as an interval")
    for column in ("ratio", "estimate", "lowest", "highest"):
        ratios.add_column(column)
    ordered = sorted(knees, key=lambda k: (k.low or 0.0, k.knee.centre or 0.0), reverse=True)
    for i, top in enumerate(ordered):
        for bottom in ordered[i + 1 :]:
            ratio = knee_ratio(top.knee, bottom.knee)
            ratios.add_row(
                f"{top.strategy} / {bottom.strategy}",
                *(rate_text(value) for value in (ratio.estimate, ratio.low, ratio.high)),
            )
    console = Console(record=True, width=160)
    with console.capture() as capture:
        console.print(table)
        console.print(ratios)
    return capture.get()


def main(args: list[str]) -> None:
    from servelab.harness.run.run import completed_summary, run
    from servelab.reports.run_report import reported

    probe = reported(partial(run, progress=False))

    def run_or_reuse(cfg: DictConfig, run_dir: Path) -> dict:
        return completed_summary(cfg, run_dir) or probe(cfg, run_dir)

    result = search(
        args,
        compose,
        run_or_reuse,
        say=lambda line: print(line, flush=True),
        seen=lambda strategy, probe: print(probe_line(strategy, probe), flush=True),
    )
    print(render_search(result.knees))
    print("the answer (as the report opens):")
    for line in answer_lines(result.knees):
        print(f"  {line}.")
    if result.record.get("cost_models"):
        from servelab.harness.run.simulate.step_errors import (
            render,
            search_step_errors,
            write_step_errors,
        )

        errors = search_step_errors(result.settings.out_dir)
        print(render(errors))
        print(f"  (written to {write_step_errors(result.settings.out_dir, errors)})")
    unresolved = [k.strategy for k in result.knees if k.budget_spent]
    if unresolved:
        print(f"not resolved within the budget: {', '.join(unresolved)} (raise search.budget_s)")
    print(f"probes and search.json under {result.settings.out_dir}")
