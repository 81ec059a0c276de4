"""`servelab profile-steps`: a step-cost model from a grid of step shapes timed on the
configured model (`harness.run.simulate.profile_steps`, which says how), for `backend=simulated
simulate.cost_model=FILE`; this verb parses its arguments and prints what was measured."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from servelab.harness.run.compose import compose
from servelab.harness.run.simulate.cost_model import TERMS
from servelab.harness.run.simulate.profile_steps import Profile, ProfileArgs, profile_steps
from servelab.harness.run.spec import engine_spec
from servelab.strategies.registry import read_config

SUMMARY = "time a grid of step shapes on the model and fit a step-cost model from it"
USAGE = """usage: servelab profile-steps [RUN_DIR ...] [out=FILE] [table=FILE] [repeats=3]
       [warmup=1] [subsets=1,2,4] [prefill_tokens=16,32,...] [prefill_cached=0,256]
       [decode_rows=1,2,...] [decode_context=32,128,...] [seed=0] [OVERRIDE ...]

Times each shape of the grid (prefill chunks of prefill_tokens after prefill_cached tokens;
decode batches of decode_rows sequences at decode_context tokens) on the configured model,
best of `repeats` after `warmup`, then the first shape again (the machine's speed drift
while profiling, said and kept in the table); writes the table (default: FILE with
.grid.json) and the step-cost model fitted on it to FILE (default
runs/profile/MODEL-DTYPE.json), and fits every n-th shape for each n of `subsets`. Each
RUN_DIR (a real run of the same model, dtype, weights, heads and device) is held out: each
fit's step-time error on its steps is printed."""


def main(args: list[str]) -> None:
    options, run_dirs, overrides = parse_args(args)
    profile = profile_steps(engine_spec(compose(overrides)), options, run_dirs)
    Console().print(render(profile))


def parse_args(args: list[str]) -> tuple[ProfileArgs, list[Path], list[str]]:
    """The verb's own `name=value` arguments, checked; the run directories (arguments with no
    `=`); the Hydra overrides."""
    names = {f.name for f in fields(ProfileArgs)}
    own: list[str] = []
    run_dirs: list[Path] = []
    overrides: list[str] = []
    for arg in args:
        if arg.partition("=")[0] in names:
            own.append(arg)
        elif "=" in arg or arg.startswith("~"):
            overrides.append(arg)
        else:
            run_dirs.append(Path(arg))
    options = read_config(ProfileArgs, OmegaConf.from_dotlist(own), "profile")
    return options, run_dirs, overrides


def render(profile: Profile) -> Table:
    """Seconds per unit of each term and where things went, then each fit's accuracy: on the
    shapes it was fitted on, and on the held-out runs' steps."""
    terms = "; ".join(f"{term} {profile.model.seconds_per_unit[term]:.3g}" for term in TERMS)
    held = profile.subsets[0].held_out
    checked = f"{held.steps} steps of {profile.held_out_runs} runs" if held else "no run given"
    table = Table(
        title=(
            f"profile-steps: {len(profile.table)} shapes in {profile.seconds:.1f} s\n"
            f"seconds per unit: {terms}\n{profile.drift.line()}\n"
            f"table: {profile.table_path}\ncost model: {profile.model_path}"
        )
    )
    for column in (
        "fitted on", "profiling", "error on them (median, p90)",
        f"error on held-out steps ({checked}: median, p90, total)",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for row in profile.subsets:
        fitted = row.model.quality
        assert fitted is not None  # a fitted model has one
        errors = row.held_out
        table.add_row(
            f"{fitted.steps} shapes (every {row.every})",
            f"{row.profiling_s:.1f} s",
            f"{fitted.median_error:.1%}, {fitted.p90_error:.1%}",
            "" if errors is None else (
                f"{errors.median_error:.1%}, {errors.p90_error:.1%}, {errors.total_error:+.1%}"
            ),
        )  # fmt: skip
    return table
