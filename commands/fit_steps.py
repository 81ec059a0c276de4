"""`servelab fit-steps RUN_DIR ... --out FILE`: a step-cost model fitted on the steps of real
runs (`harness.run.simulate.cost_model`), for `backend=simulated simulate.cost_model=FILE`.

Every run must have served the same model, dtype, weights format, head layout and device
(the model describes those, and a simulation refuses others); their strategies and workloads
may differ, and the more shapes of batch they span, the better the fit. It prints the
seconds per unit of each term and how well the model reproduces the steps it was fitted on.
"""

from __future__ import annotations

from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.measure.rundir import read_steps
from servelab.harness.run.simulate.cost_model import TERMS, described_of, fit

SUMMARY = "fit a step-cost model on real runs' steps, for backend=simulated"
USAGE = """usage: servelab fit-steps RUN_DIR [RUN_DIR ...] --out FILE

Fits each step's duration as seconds per step, per sequence, per token fed, per LM-head row,
per attended (query, key) pair and per context token, on every step of the runs (one model,
dtype, weights format, head layout and device); writes FILE for simulate.cost_model."""


def main(args: list[str]) -> None:
    if "--out" not in args or args.index("--out") == len(args) - 1:
        raise ConfigError("fit-steps", USAGE.splitlines()[0])
    out = Path(args[args.index("--out") + 1])
    run_dirs = [
        Path(a) for i, a in enumerate(args) if a != "--out" and args[i - 1 : i] != ["--out"]
    ]
    if not run_dirs:
        raise ConfigError("fit-steps", USAGE.splitlines()[0])
    described = described_of(run_dirs[0])
    for run_dir in run_dirs[1:]:
        other = described_of(run_dir)
        if other != described:
            raise ConfigError(
                "fit-steps", f"{run_dir} served {other}, but {run_dirs[0]} served {described}"
            )
    model = fit([read_steps(d) for d in run_dirs], described, [str(d) for d in run_dirs])
    model.save(out)
    quality = model.quality
    assert quality is not None  # a fitted model has one
    print(
        f"fitted on {quality.steps} steps of {len(run_dirs)} runs "
        f"({quality.warmup} warm-up steps left out)"
    )
    for term in TERMS:
        print(f"  {term:>15}: {model.seconds_per_unit[term]:.4g} s per unit")
    print(f"  {'gap':>15}: {model.gap_s:.4g} s between steps")
    print(
        f"step time error on those steps: median {quality.median_error:.1%}, "
        f"p90 {quality.p90_error:.1%}; over all their time {quality.total_error:+.1%}; "
        f"written to {out}"
    )
