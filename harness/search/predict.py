"""The simulator's knee for one strategy, which places the search's first rate probes of it.

Once a strategy's anchors have run, its step-cost model is profiled on this machine and
calibrated on every real run the search has made so far (`Profiler`, supplied by the
command: a lower layer does not profile), so the model holds the machine as it is now, not
as it was minutes before. The strategy's probes are then simulated on it: the ceiling, then
rate probes of the search's first length (the same requests its first real rate probes will
draw), halved until one is sustained, then bisected in log rate until the crossing is within
`PRECISION`. A simulated probe is judged by the point quantile of its requests' SLO ratios:
the simulation has no noise to bound, so its knee is a rate, not an interval (a budgeted
search over simulated runs left it as wide as the real one, and its middle missed by 2x).

The first real rate probes then go where the simulation says each decides, at the search's
confidence: the nearest rate below the knee whose simulated probe sustains its load, and the
nearest above whose probe misses it. Probes at the knee itself, where an accurate prediction
puts them, rarely decide either way (48 requests bound a 0.9-quantile loosely), and an
undecided probe bounds nothing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig, open_dict

from servelab.harness.search.knee import LOWEST_SHARE, KneeSettings, Prediction, Prober, ProbeSpec
from servelab.harness.search.probes import RunFn, RunProber, SimulatedClock
from servelab.harness.search.ratio_knee import ProbeQuantile, probe_quantile

# a strategy's config, the directory of the prediction's files and the real runs so far -> the
# file of a step-cost model of this machine for it, calibrated on those runs
Profiler = Callable[[DictConfig, Path, Sequence[Path]], Path]
PRECISION = 0.05  # the simulated knee's bracket, high / low - 1, when the bisection stops
MOST_PROBES = 12  # simulated rate probes of the bisection at most
STEP = 1.25  # from the knee out to a rate whose probe decides, a step at a time
STEPS = 4  # at most, each way
PREDICTED = "predicted"  # the prediction's files and simulated runs, under the search's out_dir


class Predictor:
    """`predictor(strategy)`: the strategy's simulated knee and first rates (None where no
    simulated rate is sustained), its step-cost model in `models`."""

    def __init__(
        self,
        configs: dict[str, DictConfig],
        settings: KneeSettings,
        out_dir: Path,
        run: RunFn,
        profiler: Profiler,
        say: Callable[[str], None],
    ) -> None:
        self.configs, self.settings, self.out_dir = configs, settings, out_dir
        self.run, self.profiler, self.say = run, profiler, say
        self.models: dict[str, str] = {}  # strategy -> its calibrated step-cost model's file

    def __call__(self, strategy: str) -> Prediction | None:
        cfg = self.configs[strategy]
        runs = self.real_runs()
        model = self.profiler(cfg, self.out_dir / PREDICTED, runs)
        self.models[strategy] = str(model)
        simulated = copy.deepcopy(cfg)
        simulated.backend = "simulated"
        with open_dict(simulated.simulate):
            simulated.simulate.cost_model = str(model)
        prober = RunProber(
            simulated, self.out_dir / PREDICTED / strategy, self.settings.confidence,
            self.run, SimulatedClock(),
        )  # fmt: skip
        predicted = simulated_knee(prober, self.settings)
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


def simulated_knee(prober: Prober, settings: KneeSettings) -> Prediction | None:
    """The rate where the simulated probes' ratio quantile crosses 1: below the simulated
    ceiling, halved until one is sustained, then bisected in log rate (None where none down to
    `LOWEST_SHARE` of the ceiling is); and where the first real probes decide: stepping out
    from it by `STEP` until a simulated probe is sustained at the search's confidence below
    and missed at it above (`STEPS` each way at most, else the farthest tried)."""
    ceiling = prober.run(ProbeSpec("ceiling", settings.ceiling_requests)).request_throughput
    if not ceiling:
        return None
    tried: dict[float, ProbeQuantile] = {}

    def probe(rate: float) -> ProbeQuantile:
        rate = float(f"{rate:.4g}")
        if rate not in tried:
            ratios = prober.run(ProbeSpec("rate", settings.requests, rate)).ratios
            tried[rate] = probe_quantile(ratios, settings.target, settings.confidence)
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
    below = decided(probe, knee, 1 / STEP, lambda q: q.high <= 1, tried)
    above = decided(probe, knee, STEP, lambda q: q.low > 1, tried)
    return Prediction(knee, below, above)


def decided(
    probe: Callable[[float], ProbeQuantile],
    knee: float,
    step: float,
    decides: Callable[[ProbeQuantile], bool],
    tried: dict[float, ProbeQuantile],
) -> float:
    """The nearest rate to `knee` on `step`'s side whose simulated probe `decides` (one tried
    already, or one stepped to), else the farthest stepped to."""
    side = [r for r, q in tried.items() if (r - knee) * (step - 1) > 0 and decides(q)]
    if side:
        return min(side, key=lambda r: abs(math.log(r / knee)))
    rate = knee
    for _ in range(STEPS):
        rate *= step
        if decides(probe(rate)):
            break
    return float(f"{rate:.4g}")
