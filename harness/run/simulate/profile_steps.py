"""profile-steps: a step-cost model from a grid of step shapes timed on this machine's engine.

Real runs fit a model only on the shapes their workloads happened to produce; the grid
spans prefill chunks and decode batches on purpose, in one sitting. The model is loaded as
the strategy serves it (head layout, weights format, dtype, device) and its KV cache is
sized to hold the grid's largest shape. Every shape is timed through the engine's own model
runner and sampler, the first shape is timed again after the last (how far the machine's
speed drifted meanwhile: said, kept, and flagged past 10%), the table is written (one row per
shape: its counts and seconds), the model fitted on it is written where `backend=simulated`
reads it, and the model is also fitted on every n-th shape (`subsets`), to show what a
coarser grid costs in accuracy. Real run directories given are held out: never fitted on,
their measured steps are what each fit's predictions are checked against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch
from tqdm import tqdm

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord
from servelab.engine.engine import Engine
from servelab.engine.shapes import DECODE, Shape, ShapeRunner
from servelab.harness.measure.calibrate import device_name
from servelab.harness.measure.rundir import read_steps, write_json_atomic
from servelab.harness.run.build import build_engine, kv_layout, load_for_strategy
from servelab.harness.run.simulate.cost_model import (
    StepCostModel,
    StepErrors,
    check_errors,
    described_of,
    measured_steps,
)
from servelab.harness.run.simulate.engine import described_by
from servelab.harness.run.simulate.profile import (
    TABLE_SCHEMA,
    Grid,
    Profiled,
    ShapeDrift,
    ShapeTimer,
    check_fittable,
    every_nth,
    fit_table,
)
from servelab.harness.run.spec import EngineSpec
from servelab.models.load import model_config_of
from servelab.models.model import ModelConfig
from servelab.strategies.decoding.speculative import SpeculativeConfig

GRID_FIELDS = tuple(f.name for f in fields(Grid))


@dataclass(frozen=True)
class ProfileArgs:
    """The verb's own arguments (the rest are run directories and Hydra overrides); a grid
    list left unset keeps `Grid`'s default."""

    out: str | None = field(default=None, metadata={"help": "the cost model's file"})
    table: str | None = field(default=None, metadata={"help": "the profiled table's file"})
    repeats: int = field(default=3, metadata={"minimum": 1, "help": "timed forwards per shape"})
    warmup: int = field(default=1, metadata={"minimum": 0, "help": "untimed forwards first"})
    subsets: str = field(default="1,2,4", metadata={"help": "fit every n-th shape, each n"})
    seed: int = field(default=0, metadata={"minimum": 0, "help": "the made-up tokens' seed"})
    prefill_tokens: str | None = None
    prefill_cached: str | None = None
    decode_rows: str | None = None
    decode_context: str | None = None

    def grid(self) -> Grid:
        given = {name: getattr(self, name) for name in GRID_FIELDS}
        minimum = {"prefill_cached": 0}
        return Grid(
            **{
                name: whole_numbers(name, text, minimum.get(name, 1))
                for name, text in given.items()
                if text is not None
            }
        )

    def every(self) -> tuple[int, ...]:
        return whole_numbers("subsets", self.subsets, 1)


def whole_numbers(name: str, text: str, minimum: int) -> tuple[int, ...]:
    """`16,32,64` -> (16, 32, 64), each at least `minimum`."""
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isdigit() and int(part) >= minimum for part in parts):
        raise ConfigError(
            f"profile.{name}", f"{text!r}: give whole numbers of at least {minimum}, e.g. 16,32"
        )
    return tuple(int(part) for part in parts)


@dataclass(frozen=True)
class Subset:
    """The model fitted on every `every`-th shape, and how well it predicts."""

    every: int
    model: StepCostModel
    profiling_s: float  # what profiling only these shapes took
    held_out: StepErrors | None  # on the held-out runs' steps (None: no run given)


@dataclass(frozen=True)
class Profile:
    """What the verb measured and wrote."""

    table: list[Profiled]
    model: StepCostModel
    subsets: list[Subset]
    drift: ShapeDrift
    seconds: float  # the whole profiling, model load and KV allocation included
    held_out_runs: int
    table_path: Path
    model_path: Path


def profile_steps(
    checked: EngineSpec, options: ProfileArgs, run_dirs: list[Path], progress: bool = True
) -> Profile:
    """Check everything, profile the grid, write the table and the model, fit the subsets."""
    began = time.perf_counter()
    grid, every = options.grid(), options.every()
    shapes = grid.shapes()
    for n in every:
        check_fittable(len(every_nth(shapes, n)), "profile.subsets")
    if isinstance(checked.strategy.decoding.config, SpeculativeConfig):
        raise ConfigError("strategy.decoding", "profile the target alone: set it to standard")
    config = model_config_of(checked.model)  # from its file, without weights
    check_context(config, shapes)
    described = described_by(checked.settings, checked.strategy, checked.model.name)
    held_out = held_out_steps(run_dirs, described)
    model_path = Path(options.out or f"runs/profile/{checked.model.name}-{described['dtype']}.json")
    table_path = Path(options.table or model_path.with_suffix(".grid.json"))
    engine = profiling_engine(checked, grid, progress)
    timer = ShapeTimer(
        ShapeRunner(engine.runner, engine.kv, engine.decoder, config.vocab_size, options.seed)
    )
    bar = tqdm(shapes, desc="profile-steps: shapes", unit="shape", disable=not progress)
    table = [timer.profile(shape, options.repeats, options.warmup) for shape in bar]
    drift = timer.drift(table[0], options.repeats)
    seconds = time.perf_counter() - began
    write_table(table_path, table, drift, described, options, seconds)
    measured_on = device_name(checked.settings.device)
    model = replace(fit_table(table, described, [str(table_path)]), measured_on=measured_on)
    model.save(model_path)
    subsets = [subset(table, n, described, table_path, held_out) for n in every]
    return Profile(table, model, subsets, drift, seconds, len(run_dirs), table_path, model_path)


def check_context(config: ModelConfig, shapes: list[Shape]) -> None:
    """Every shape fits the model's context."""
    longest = max(shapes, key=lambda shape: shape.context)
    if longest.context > config.max_context:
        name = "decode_context" if longest.kind == DECODE else "prefill_tokens"
        raise ConfigError(
            f"profile.{name}",
            f"a shape reaches {longest.context} tokens of context; "
            f"the model holds {config.max_context}",
        )


def held_out_steps(run_dirs: list[Path], described: dict[str, str]) -> list[StepRecord]:
    """The measured steps of the held-out runs, each checked to have served what the
    profiled model serves."""
    for run_dir in run_dirs:
        served = described_of(run_dir)
        if served != described:
            raise ConfigError(
                "profile-steps", f"{run_dir} served {served}, but this profile is of {described}"
            )
    steps = measured_steps([read_steps(run_dir) for run_dir in run_dirs])
    if run_dirs and not steps:
        raise ConfigError("profile-steps", "the held-out runs have no measured steps")
    return steps


def profiling_engine(checked: EngineSpec, grid: Grid, progress: bool) -> Engine:
    """The engine serving the configured model as the strategy serves it (loaded as a run
    loads it), its KV cache sized to hold the grid's largest shape whatever
    `engine.kv_budget` says."""
    settings, strategy = checked.settings, checked.strategy
    torch.manual_seed(settings.seed)
    served = load_for_strategy(checked.model, settings, strategy, progress)
    per_token = kv_layout(served.model, settings.dtype).bytes_per_token
    slots = grid.kv_slots(strategy.kv_block_size)
    sized = replace(settings, kv_budget_bytes=slots * per_token, kv_budget_fraction=None)
    return build_engine(served.model, sized, strategy, time.perf_counter)


def write_table(
    path: Path,
    table: list[Profiled],
    drift: ShapeDrift,
    described: dict[str, str],
    options: ProfileArgs,
    seconds: float,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {
            "schema": TABLE_SCHEMA,
            "described": described,
            "repeats": options.repeats,
            "warmup": options.warmup,
            "seed": options.seed,
            "seconds": seconds,
            "drift": drift.to_json(),
            "shapes": [row.to_json() for row in table],
        },
    )


def subset(
    table: list[Profiled],
    every: int,
    described: dict[str, str],
    table_path: Path,
    held_out: list[StepRecord],
) -> Subset:
    rows = every_nth(table, every)
    model = fit_table(rows, described, [f"{table_path} (every {every})"])
    errors = check_errors(model, held_out) if held_out else None
    return Subset(every, model, sum(row.elapsed_s for row in rows), errors)
