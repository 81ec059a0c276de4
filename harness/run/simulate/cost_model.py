"""The step-cost model: how long one engine step takes, from the shape of its batch alone.

A step's time is a sum of terms, each a count the step's batch fixes times seconds per unit:

- `step`: 1 per step (reading the weights once, launching the layers, scheduling);
- `seqs`: sequences in the batch (per-sequence bookkeeping, sampling, KV indexing);
- `tokens`: tokens fed, padding included (the linear layers' work per token);
- `logits_rows`: rows the LM head scores;
- `attended_pairs`: (query, key) pairs causal attention scores;
- `context_tokens`: context the batch's sequences hold (KV bytes attention reads).

plus `gap_s`, the time from one step's end to the next one's start while work waits (the
loop's own overhead: admitting, writing records). `fit_counts` finds the seconds per unit
from measured steps' counts, least squares with no negative coefficient: `fit` on the steps
of real runs (`steps.jsonl` records every count), `harness.run.simulate.profile` on a grid of
step shapes timed on the model. `check_errors` says how well a model predicts steps it was
not fitted on. The model keeps what it was fitted on, so a simulation can refuse a run it
does not describe (another model, dtype, weights format or head layout).

`calibrated` corrects a model on real runs' steps: the loop's own time a step and between
steps as measured there, and per kind of step (`KINDS`: prefill, decode, mixed) the
measured time over the predicted, multiplying that kind's predictions (`kind_scale`). A
profile is timed in seconds on a shared machine whose speed moves between minutes, and not
by the same factor for every kind (decode reads the weights once a step, prefill computes),
so a search corrects its model on its own probes' steps before each prediction.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from operator import mul
from pathlib import Path

import numpy as np

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord, fed_kind, step_kind
from servelab.engine.model_runner import StepShape

TERMS = ("step", "seqs", "tokens", "logits_rows", "attended_pairs", "context_tokens")
KINDS = ("prefill", "decode", "mixed")  # what a step fed: prompt tokens, next tokens, or both
WARMUP_STEPS = 2  # each run's first steps, left out of a fit
BUSY_GAP_S = 0.05  # a gap longer than this between two steps is the engine idle, not overhead


@dataclass
class StepCounts:
    """The counts a step's batch fixes, one per term of the cost model (a plain dataclass: a
    simulation makes one every step)."""

    seqs: int
    tokens: int
    logits_rows: int
    attended_pairs: int
    context_tokens: int
    kind: str = "decode"  # one of KINDS

    @classmethod
    def of_shape(cls, shape: StepShape) -> StepCounts:
        """A feed's counts; a row of one token is a decode row (as a padded row is)."""
        decode = sum(1 for n in shape.query_lens if n == 1)
        return cls(
            seqs=len(shape.query_lens),
            tokens=sum(shape.query_lens),
            logits_rows=shape.num_logits,
            attended_pairs=shape.attended_pairs,
            context_tokens=shape.context_tokens,
            kind=fed_kind(len(shape.query_lens) - decode, decode),
        )

    @classmethod
    def of_record(cls, record: StepRecord) -> StepCounts:
        return cls(
            seqs=record.num_seqs,
            tokens=record.prefill_tokens + record.decode_tokens + record.pad_tokens,
            logits_rows=record.logits_rows,
            attended_pairs=record.attended_pairs,
            context_tokens=record.context_tokens,
            kind=step_kind(record),
        )

    def row(self) -> list[float]:
        """The counts in `TERMS` order (`step` is 1)."""
        return [
            1.0,
            self.seqs,
            self.tokens,
            self.logits_rows,
            self.attended_pairs,
            self.context_tokens,
        ]


@dataclass(frozen=True)
class StepErrors:
    """How far predicted step times fall from measured ones."""

    steps: int  # steps compared
    median_error: float  # median |predicted - measured| / measured, per step
    p90_error: float
    total_error: float  # predicted / measured - 1 over the sum of every step's time

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> StepErrors:
        relative = np.abs(predicted - measured) / measured
        return cls(
            steps=len(measured),
            median_error=float(np.median(relative)),
            p90_error=float(np.quantile(relative, 0.9)),
            total_error=float(predicted.sum()) / float(measured.sum()) - 1.0,
        )


@dataclass(frozen=True)
class FitQuality(StepErrors):
    """How well the fitted model reproduces the steps it was fitted on (a profiled grid's
    shapes count as its steps)."""

    warmup: int = 0  # steps left out: each run's first


@dataclass(frozen=True)
class StepCostModel:
    seconds_per_unit: dict[str, float]  # term -> seconds per unit of its count
    gap_s: float  # from one step's end to the next one's start while work waits
    described: dict[str, str]  # what the steps came from: model, dtype, weights, heads, device
    quality: FitQuality | None = None  # None: not fitted (derived from a hardware description)
    sources: list[str] = field(default_factory=list)  # the run directories fitted on
    kind_scale: dict[str, float] = field(default_factory=dict)  # kind -> factor (`calibrated`)
    calibrated_on: list[str] = field(default_factory=list)  # the run directories it scales by
    measured_on: str = ""  # the device its steps were timed on, by name ("": not recorded)

    def step_seconds(self, counts: StepCounts) -> float:
        """The predicted duration of one step with these counts, correctly rounded (`fsum`):
        the builtin sum rounds differently from Python 3.12 on, and a simulated run must
        record the same times on every Python."""
        seconds = math.fsum(map(mul, self._per_unit, counts.row()))
        return seconds * self.kind_scale.get(counts.kind, 1.0)

    @cached_property
    def _per_unit(self) -> tuple[float, ...]:
        """Seconds per unit in `TERMS` order (a term not fitted costs nothing)."""
        return tuple(self.seconds_per_unit.get(term, 0.0) for term in TERMS)

    def check_describes(self, wanted: dict[str, str], field: str = "simulate.cost_model") -> None:
        """A ConfigError when a run's model, dtype, weights or heads differ from the fit's."""
        for key, value in wanted.items():
            fitted = self.described.get(key)
            if fitted is not None and fitted != value:
                raise ConfigError(
                    field,
                    f"fitted on {key} {fitted!r}, but this run serves {value!r}: fit one on "
                    "runs of this configuration",
                )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> StepCostModel:
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ConfigError("simulate.cost_model", f"cannot read {path}: {error}") from error
        quality = payload.get("quality")
        return cls(
            seconds_per_unit={str(k): float(v) for k, v in payload["seconds_per_unit"].items()},
            gap_s=float(payload["gap_s"]),
            described={str(k): str(v) for k, v in payload["described"].items()},
            quality=FitQuality(**quality) if quality else None,
            sources=list(payload.get("sources", [])),
            kind_scale={str(k): float(v) for k, v in (payload.get("kind_scale") or {}).items()},
            calibrated_on=list(payload.get("calibrated_on", [])),
            measured_on=str(payload.get("measured_on", "")),
        )


def fit(
    runs: Sequence[Sequence[StepRecord]], described: dict[str, str], sources: list[str]
) -> StepCostModel:
    """Seconds per unit of each term from the steps of real runs (each run's steps in order),
    fitted on every step `measured_steps` keeps. Slow steps from a noisy neighbour are kept: a
    real run lives through them too, and the fit's mean stays true."""
    steps = measured_steps(runs)
    if len(steps) < 2 * len(TERMS):
        raise ConfigError(
            "fit-steps", f"{len(steps)} steps with work; need at least {2 * len(TERMS)} to fit"
        )
    seconds_per_unit, errors = fit_counts(
        [StepCounts.of_record(step) for step in steps], [duration(step) for step in steps]
    )
    warmup = sum(min(len(run), WARMUP_STEPS) for run in runs)
    return StepCostModel(
        seconds_per_unit=seconds_per_unit,
        gap_s=busy_gap_s(runs),
        described=described,
        quality=FitQuality(**asdict(errors), warmup=warmup),
        sources=sources,
    )


def measured_steps(runs: Sequence[Sequence[StepRecord]]) -> list[StepRecord]:
    """The steps a fit or a check compares: every step with work but each run's first
    `WARMUP_STEPS` (first touches of the weights and caches)."""
    return [
        step
        for run in runs
        for step in run[WARMUP_STEPS:]
        if step.num_seqs > 0 and step.t_end > step.t_start
    ]


def duration(step: StepRecord) -> float:
    return step.t_end - step.t_start


def fit_counts(
    counts: Sequence[StepCounts], seconds: Sequence[float]
) -> tuple[dict[str, float], StepErrors]:
    """Seconds per unit of each term from steps' counts and measured seconds (a run's steps,
    or a profiled grid's shapes): least squares with no coefficient below zero; and how well
    they reproduce those steps."""
    rows = np.array([c.row() for c in counts])
    measured = np.array(seconds, dtype=float)
    coefficients = _nonnegative_least_squares(rows, measured)
    seconds_per_unit = dict(zip(TERMS, map(float, coefficients), strict=True))
    return seconds_per_unit, StepErrors.of(rows @ coefficients, measured)


def check_errors(model: StepCostModel, steps: Sequence[StepRecord]) -> StepErrors:
    """How far `model`'s predictions fall from measured steps it was not fitted on."""
    predicted = np.array([model.step_seconds(StepCounts.of_record(step)) for step in steps])
    return StepErrors.of(predicted, np.array([duration(step) for step in steps]))


def loop_in_step_s(steps: Sequence[StepRecord]) -> float:
    """The median of a step's time outside its model forward: scheduling, the update, the
    record (0 where no step is given)."""
    return statistics.median(duration(s) - s.model_s for s in steps) if steps else 0.0


def calibrated(
    model: StepCostModel, runs: Sequence[Sequence[StepRecord]], names: Sequence[str]
) -> StepCostModel:
    """`model` (forwards only, from a profiled grid) corrected on real `runs` (named `names`):
    the loop's median time inside a step beside the forward added to every step, its gap
    between steps while work waits, then each kind's measured over predicted time as that
    kind's factor (a kind the runs never stepped gets the factor of all their steps)."""
    steps = measured_steps(runs)
    if not steps:
        return model
    per_unit = dict(model.seconds_per_unit)
    per_unit["step"] = per_unit.get("step", 0.0) + max(loop_in_step_s(steps), 0.0)
    looped = replace(model, seconds_per_unit=per_unit, gap_s=busy_gap_s(runs), kind_scale={})
    sums = {kind: [0.0, 0.0] for kind in KINDS}  # measured, predicted
    for step in steps:
        counts = StepCounts.of_record(step)
        sums[counts.kind][0] += duration(step)
        sums[counts.kind][1] += looped.step_seconds(counts)
    whole = math.fsum(m for m, _ in sums.values()) / math.fsum(p for _, p in sums.values())
    scale = {kind: (m / p if p > 0 else whole) for kind, (m, p) in sums.items()}
    return replace(looped, kind_scale=scale, calibrated_on=list(names))


def busy_gap_s(runs: Sequence[Sequence[StepRecord]]) -> float:
    """The median time from a step's end to the next one's start when the next follows at
    once (requests were waiting or running): the loop's own overhead between steps."""
    gaps = [
        later.t_start - earlier.t_end
        for run in runs
        for earlier, later in zip(run, run[1:], strict=False)
        if earlier.running + earlier.waiting > earlier.delivered
        and 0 <= later.t_start - earlier.t_end <= BUSY_GAP_S
    ]
    return statistics.median(gaps) if gaps else 0.0


def _nonnegative_least_squares(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a term whose best coefficient is negative
    is dropped (held at zero) and the rest refitted, until none is. Columns are scaled to
    unit norm first, since the counts span many orders of magnitude."""
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    scaled = rows / scale
    active = [i for i in range(rows.shape[1]) if np.any(rows[:, i])]
    while True:
        solution = np.zeros(rows.shape[1])
        solution[active] = np.linalg.lstsq(scaled[:, active], seconds, rcond=None)[0]
        negative = [i for i in active if solution[i] < 0]
        if not negative:
            return solution / scale
        active.remove(min(negative, key=lambda i: solution[i]))


def described_of(run_dir: Path) -> dict[str, str]:
    """What a run served, in the terms a cost model describes (`described_by`)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError("fit-steps", f"{run_dir} has no readable meta.json: {error}") from error
    if "simulated" in meta:
        raise ConfigError("fit-steps", f"{run_dir} is a simulated run: fit on real runs only")
    strategy, model = meta.get("strategy") or {}, meta.get("config", {}).get("model", {})
    return {
        "model": str(model.get("name", model.get("shape", "model"))),
        "dtype": str((meta.get("dtype") or {}).get("name")),
        "weights": str(strategy.get("weights")),
        "heads": str(strategy.get("heads")),
        "device": str((meta.get("device") or {}).get("type")),
    }
