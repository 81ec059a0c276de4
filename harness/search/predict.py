"""The simulator's knee for one strategy, which places the search's first rate probes of it.

Once a strategy's anchors have run, its step-cost model is profiled on this machine
(`profiled`: `servelab profile-steps` on `PREDICTION_GRID`) and calibrated on every real run
the search has made so far, so the model holds the machine as it is now, not as it was
minutes before. The strategy's probes are then simulated on it: the ceiling, then
rate probes of the search's first length (the same requests its first real rate probes will
draw), halved until one is sustained, then bisected in log rate until the crossing is within
`PRECISION`. A simulated probe is judged by the point quantile of its requests' SLO ratios:
the simulation has no noise to bound, so its knee is a rate, not an interval (a budgeted
search over simulated runs left it as wide as the real one, and its middle far off).

The first real rate probes then go where the simulation says each decides, at the search's
confidence (`policy.ProbePolicy.decisive_rate`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, open_dict

from servelab.harness.measure.rundir import read_steps
from servelab.harness.run.simulate.cost_model import StepCostModel, calibrated
from servelab.harness.run.simulate.engine import described_by
from servelab.harness.run.simulate.profile_steps import ProfileArgs, profile_steps
from servelab.harness.run.spec import engine_spec
from servelab.harness.search.policy import LOWEST_SHARE, Prediction, ProbePolicy
from servelab.harness.search.probe_ratios import ProbeQuantile, probe_quantile
from servelab.harness.search.probes import Prober, ProbeSpec, RunFn, RunProber, SimulatedClock
from servelab.models.load import model_config_of

PRECISION = 0.05  # the simulated knee's bracket, high / low - 1, when the bisection stops
MOST_PROBES = 12  # simulated rate probes of the bisection at most
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
PREDICTED = "predicted"  # the prediction's files and simulated runs, under the search's out_dir


class Predictor:
    """`predictor(strategy)`: the strategy's simulated knee and first rates (None where no
    simulated rate is sustained), its step-cost model in `models`."""

    def __init__(
        self,
        configs: dict[str, DictConfig],
        policy: ProbePolicy,
        out_dir: Path,
        run: RunFn,
        say: Callable[[str], None],
    ) -> None:
        self.configs, self.policy, self.out_dir = configs, policy, out_dir
        self.run, self.say = run, say
        self.models: dict[str, str] = {}  # strategy -> its calibrated step-cost model's file

    def __call__(self, strategy: str) -> Prediction | None:
        cfg = self.configs[strategy]
        runs = self.real_runs()
        model = profiled(cfg, self.out_dir / PREDICTED, runs)
        self.models[strategy] = str(model)
        simulated = copy.deepcopy(cfg)
        simulated.backend = "simulated"
        with open_dict(simulated.simulate):
            simulated.simulate.cost_model = str(model)
        prober = RunProber(
            simulated, self.out_dir / PREDICTED / strategy, self.policy.confidence,
            self.run, SimulatedClock(),
        )  # fmt: skip
        predicted = simulated_knee(prober, self.policy)
        self.say(
            f"  {strategy}: "
            + (
                "no simulated rate is sustained"
                if predicted is None
                else f"predicted knee {predicted.knee:.3g} req/s; the first rate probes at "
                f"{predicted.below:.3g} and {predicted.above:.3g}, where simulated probes decide"
            )
            + f" (simulated on steps profiled here, calibrated on the search's {len(runs)} real "
            "runs so far)"
        )
        return predicted

    def real_runs(self) -> list[Path]:
        """Every run of the search so far with steps (its simulated ones left out)."""
        return [
            path.parent
            for path in sorted(self.out_dir.glob("*/*/steps.jsonl"))
            if path.parent.parent.name != PREDICTED
        ]


def simulated_knee(prober: Prober, policy: ProbePolicy) -> Prediction | None:
    """The rate where the simulated probes' ratio quantile crosses 1: below the simulated
    ceiling, halved until one is sustained, then bisected in log rate (None where none down to
    `LOWEST_SHARE` of the ceiling is); and where the first real probes decide, either side of
    it (`ProbePolicy.decisive_rate`)."""
    ceiling = prober.run(ProbeSpec("ceiling", policy.ceiling_requests)).request_throughput
    if not ceiling:
        return None
    tried: dict[float, ProbeQuantile] = {}

    def probe(rate: float) -> ProbeQuantile:
        rate = float(f"{rate:.4g}")
        if rate not in tried:
            ratios = prober.run(ProbeSpec("rate", policy.requests, rate)).ratios
            # as independent draws: a probe that decides on them places a first real probe,
            # which, where its requests count as fewer, the next probe there lengthens
            tried[rate] = probe_quantile(ratios, policy.target, policy.confidence, independent=True)
        return tried[rate]

    low, high = None, ceiling
    rate = ceiling / 2
    for _ in range(MOST_PROBES):
        sustained = probe(rate).quantile <= 1
        low, high = (rate, high) if sustained else (low, rate)
        if low is None:
            if rate <= ceiling * LOWEST_SHARE:
                return None
            rate /= 2
        elif high / low <= 1 + PRECISION:
            break
        else:
            rate = math.sqrt(low * high)
    if low is None:
        return None
    knee = math.sqrt(low * high)
    below = policy.decisive_rate(probe, knee, False, tried)
    above = policy.decisive_rate(probe, knee, True, tried)
    return Prediction(knee, below, above)


def profiled(cfg: DictConfig, out_dir: Path, runs: Sequence[Path]) -> Path:
    """A step-cost model of this machine serving `cfg`'s model as its strategy serves it:
    `servelab profile-steps` on `PREDICTION_GRID`, profiled once per search and kind of model
    served (strategies that serve the same one share it), calibrated on the real `runs` so far
    (`cost_model.calibrated`), in `out_dir`."""
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
