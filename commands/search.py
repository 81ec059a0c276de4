"""`servelab search`: each strategy's knee, the highest rate it sustains under the SLO, as an
interval found on this machine. The search is `harness.search.profile` (its probes and
budget `harness.search.knee`, its estimator `harness.search.ratio_knee`); this file prints
its plan, each probe as it ends, and the knees and their ratios at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.harness.runner.compose import compose
from servelab.harness.search.knee import Knee, Probe
from servelab.harness.search.profile import search
from servelab.harness.search.ratio_knee import (
    ProbeQuantile,
    centre,
    knee_ratio,
    knee_text,
    rate_text,
)
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


def render_search(knees: list[Knee]) -> str:
    table = Table(title="sustained request rate: where the SLO ratios' quantile crosses 1")
    for column in ("strategy", "predicted", "ceiling", "knee", "rate probes", "note"):
        table.add_column(column)
    for knee in knees:
        probes = ", ".join(
            f"{p.spec.rate:.3g}x{p.spec.requests}:{p.quantile.quantile:.2g}"
            + ("^" if p.quantile.over_capacity else "")
            for p in knee.rate_probes
        )
        found = "-" if knee.found is None else knee_text(knee.found)
        note = knee.note or ("" if knee.resolved else "not within the resolution")
        table.add_row(
            knee.strategy, predicted_text(knee), rate_text(knee.ceiling), found, probes, note
        )
    ratios = Table(title="sustained-rate ratios: the knees' ratio, as an interval")
    for column in ("ratio", "estimate", "lowest", "highest"):
        ratios.add_column(column)
    ordered = sorted(knees, key=lambda k: (k.low or 0.0, centre(k) or 0.0), reverse=True)
    for i, top in enumerate(ordered):
        for bottom in ordered[i + 1 :]:
            ratio = knee_ratio(top, bottom)
            ratios.add_row(
                f"{top.strategy} / {bottom.strategy}",
                *(rate_text(value) for value in (ratio.estimate, ratio.low, ratio.high)),
            )
    console = Console(record=True, width=160)
    with console.capture() as capture:
        console.print(table)
        console.print(ratios)
    return capture.get()


# The shapes profiled for the prediction: prefill chunks and decode batches of the sizes a
# search's probes step through (the grid's default reaches 1,024 tokens of context, which
# takes longer than a prediction is worth), each within the model's context; two timings a
# shape after one untimed.
PREDICTION_GRID = {
    "prefill_tokens": (16, 32, 64, 128, 256, 512),
    "prefill_cached": (0, 128),
    "decode_rows": (1, 2, 4, 8, 16),
    "decode_context": (32, 128, 256, 512),
}


def profiled(cfg: DictConfig, out_dir: Path, runs: Sequence[Path]) -> Path:
    """A step-cost model of this machine serving `cfg`'s model as its strategy serves it:
    `servelab profile-steps` on `PREDICTION_GRID`, profiled once per search and kind of model
    served (strategies that serve the same one share it), calibrated on the real `runs` so far
    (`cost_model.calibrated`), in `out_dir`."""
    from servelab.harness.measure.rundir import read_steps
    from servelab.harness.runner.spec import engine_spec
    from servelab.harness.simulate.backend import described_by
    from servelab.harness.simulate.cost_model import StepCostModel, calibrated
    from servelab.harness.simulate.profile_steps import ProfileArgs, profile_steps
    from servelab.models.load import model_config_of

    checked = engine_spec(cfg)
    described = described_by(checked.settings, checked.strategy, checked.model.name)
    grid = out_dir / ("steps-" + "-".join(described.values()) + ".json")
    if not grid.exists():
        print(f"profiling this machine's steps for the prediction ({grid})", flush=True)
        context = model_config_of(checked.model).max_context
        room = {"prefill_tokens": context - max(PREDICTION_GRID["prefill_cached"]),
                "decode_context": context}  # fmt: skip
        within = {
            name: ",".join(str(n) for n in sizes if n <= room.get(name, n))
            for name, sizes in PREDICTION_GRID.items()
        }
        options = ProfileArgs(out=str(grid), repeats=2, warmup=1, subsets="1", **within)
        profile_steps(checked, options, [], progress=False)
    path = grid.with_name(f"{grid.stem}-{cfg.strategy.name}.json")
    names = [str(run.resolve()) for run in runs]
    calibrated(StepCostModel.load(grid), [read_steps(run) for run in runs], names).save(path)
    return path


def main(args: list[str]) -> None:
    from servelab.harness.runs.run import completed_summary, run
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
        profiler=profiled,
    )
    print(render_search(result.knees))
    print("the answer (as the report opens):")
    for line in answer_lines(result.knees):
        print(f"  {line}.")
    if result.record.get("cost_models"):
        from servelab.harness.simulate.step_errors import (
            render,
            search_step_errors,
            write_step_errors,
        )

        errors = search_step_errors(result.settings.out_dir)
        print(render(errors))
        print(f"  (written to {write_step_errors(result.settings.out_dir, errors)})")
    unresolved = [k.strategy for k in result.knees if not k.resolved]
    if unresolved:
        print(f"not resolved within the budget: {', '.join(unresolved)} (raise search.budget_s)")
    print(f"probes and search.json under {result.settings.out_dir}")
