"""Where the simulator's error arises: each strategy's real steps against the step-cost model's
prediction for the same counts, by kind of step, and the loop's own time measured beside what
the model gives it.

A search that predicts its knees (`search.predict`) simulates each strategy on a step-cost
model profiled on this machine (`servelab profile-steps` on a grid of forwards) and corrected
on the real runs the search had made when it predicted (`cost_model.calibrated`). Every later
probe of that strategy is held out: here each of their steps is predicted from its counts and
set beside its measured duration (start to end, the loop's work inside the step included),
grouped by the step's kind:

- `prefill`: prompt tokens only; `decode`: one new token per sequence only;
- `mixed`: prompt chunks beside decode rows in one step (iteration batching, chunked prefill);
- `padded`: any padding computed (static batching's padded prompts and finished rows).

Per strategy and kind: steps, median and 90th-percentile |predicted - measured| / measured,
the error over their summed time, and the loop's own time inside a step (median of duration
minus the model forward, `model_s`), against the model's; per strategy, the gap between steps
while work waits, measured (`busy_gap_s`) against the model's `gap_s`. `servelab step-errors
SEARCH_DIR` prints it; `servelab search` prints it and writes `step_errors.json` beside
`search.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord, fed_kind
from servelab.harness.measure.rundir import read_steps
from servelab.harness.run.simulate.cost_model import KINDS as FED_KINDS
from servelab.harness.run.simulate.cost_model import (
    StepCostModel,
    StepErrors,
    busy_gap_s,
    check_errors,
    loop_in_step_s,
    measured_steps,
)

KINDS = (*FED_KINDS, "padded")
FILE = "step_errors.json"


def step_kind(step: StepRecord) -> str:
    """prefill, decode, mixed (both in one step: the kinds a model is calibrated by), or padded
    (any padding computed)."""
    return "padded" if step.pad_tokens else fed_kind(step.prefill_tokens, step.decode_tokens)


@dataclass(frozen=True)
class KindErrors:
    """One strategy's steps of one kind, predicted against measured."""

    strategy: str
    kind: str  # one of KINDS, or "all"
    errors: StepErrors
    loop_in_step_s: float  # measured: the median time of a step outside its forward

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "kind": self.kind, **asdict(self.errors),
                "loop_in_step_s": self.loop_in_step_s}  # fmt: skip


@dataclass(frozen=True)
class StrategyErrors:
    strategy: str
    model: str  # the step-cost model's file
    kinds: list[KindErrors]  # each kind that occurred, then "all"
    gap_s: float  # measured: the loop's time between steps while work waits
    model_gap_s: float  # the model's

    def to_json(self) -> dict:
        kinds = [k.to_json() for k in self.kinds]
        return {"strategy": self.strategy, "model": self.model, "gap_s": self.gap_s,
                "model_gap_s": self.model_gap_s, "kinds": kinds}  # fmt: skip


def strategy_errors(
    strategy: str, model_path: Path, runs: Sequence[Sequence[StepRecord]]
) -> StrategyErrors:
    """`runs`' steps (each run's first ones left out, as a fit leaves them) predicted by the
    model at `model_path`, by kind."""
    model = StepCostModel.load(model_path)
    steps = measured_steps(runs)
    groups = {kind: [s for s in steps if step_kind(s) == kind] for kind in KINDS} | {"all": steps}
    kinds = [
        KindErrors(strategy, kind, check_errors(model, members), loop_in_step_s(members))
        for kind, members in groups.items()
        if members
    ]
    return StrategyErrors(strategy, str(model_path), kinds, busy_gap_s(runs), model.gap_s)


def search_step_errors(search_dir: Path) -> list[StrategyErrors]:
    """Every strategy of a search that predicted its knees: its probes' steps against the
    step-cost model its prediction simulated (`search.json`'s `cost_models`), but those of
    the runs the model was calibrated on."""
    try:
        record = json.loads((search_dir / "search.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(
            "step-errors", f"no search.json to read in {search_dir}: {error}"
        ) from error
    models = record.get("cost_models") or {}
    if not models:
        raise ConfigError(
            "step-errors", f"{search_dir}'s search predicted no knees (search.predict=true does)"
        )
    out = []
    for strategy, path in models.items():
        fitted_on = set(StepCostModel.load(Path(path)).calibrated_on)
        runs = [
            read_steps(p.parent)
            for p in sorted((search_dir / strategy).glob("*/steps.jsonl"))
            if str(p.parent.resolve()) not in fitted_on
        ]
        if any(runs):
            out.append(strategy_errors(strategy, Path(path), runs))
    return out


def write_step_errors(search_dir: Path, errors: list[StrategyErrors]) -> Path:
    path = search_dir / FILE
    path.write_text(json.dumps([e.to_json() for e in errors], indent=2) + "\n")
    return path


def render(errors: list[StrategyErrors]) -> str:
    """The table, a row per strategy and kind of step."""
    lines = [
        "step time predicted (the search's step-cost model) against measured (its probes' "
        "steps, none fitted on):",
        f"  {'strategy':<20} {'kind':<8} {'steps':>6} {'median':>7} {'p90':>7} {'total':>7} "
        f"{'loop in step':>13}",
    ]
    for strategy in errors:
        for k in strategy.kinds:
            e = k.errors
            lines.append(
                f"  {k.strategy:<20} {k.kind:<8} {e.steps:>6} {e.median_error:>7.1%} "
                f"{e.p90_error:>7.1%} {e.total_error:>+7.1%} {k.loop_in_step_s * 1e3:>10.2f} ms"
            )
        lines.append(
            f"  {strategy.strategy:<20} between steps while work waits: "
            f"{strategy.gap_s * 1e3:.2f} ms measured, {strategy.model_gap_s * 1e3:.2f} ms modelled"
        )
    return "\n".join(lines)
