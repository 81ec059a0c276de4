"""A step-cost model from a grid of step shapes timed on the real model (`servelab
profile-steps`), rather than from whatever shapes real runs happened to serve.

The grid's shapes are prefill chunks (one sequence, many tokens, after an empty or a filled
cache) and decode batches (many sequences, one token each, at a context length), each fed to
the model runner as `engine.shapes` feeds one (its logits accepted, which is what a
step record's `model_s` times); its time is the best of `repeats` after `warmup` untimed
forwards. Its counts are the engine's own (the feed's `StepShape`, `StepCounts`), so the
table and a run's steps are counted alike and fitted by the one function (`fit_counts`).

In every shape each sequence's next token is due, so `seqs` and `logits_rows` move together
and the fit splits their cost evenly; and the grid times forwards only: the loop's
bookkeeping around a step (scheduling, the update, the record: a small share of a step) and
the gap between steps are not in it (`gap_s` is 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from servelab.base.errors import ConfigError
from servelab.engine.shapes import DECODE, PREFILL, Shape, ShapeRunner
from servelab.harness.measure.drift import DRIFT_LIMIT, Drift
from servelab.harness.run.simulate.cost_model import (
    TERMS,
    FitQuality,
    StepCostModel,
    StepCounts,
    fit_counts,
)

TABLE_SCHEMA = 1
MIN_SHAPES = len(TERMS)  # a fit of every term needs at least as many shapes as terms
T = TypeVar("T")


@dataclass(frozen=True)
class Grid:
    """The shapes profiled: each prefill chunk length after each cached length, and each
    decode batch size at each context length."""

    prefill_tokens: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    prefill_cached: tuple[int, ...] = (0, 256)
    decode_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_context: tuple[int, ...] = (32, 128, 512, 1024)

    def shapes(self) -> list[Shape]:
        prefill = [
            Shape(PREFILL, 1, tokens, cached)
            for cached in self.prefill_cached
            for tokens in self.prefill_tokens
        ]
        decode = [
            Shape(DECODE, rows, 1, context - 1)
            for rows in self.decode_rows
            for context in self.decode_context
        ]
        return prefill + decode

    def kv_slots(self, block_size: int) -> int:
        """Slots the largest shape holds at once: each sequence's context and one more token
        (a contiguous slab reserves its output too), in whole blocks."""
        return max(
            shape.rows * -(-(shape.context + 1) // block_size) * block_size
            for shape in self.shapes()
        )


@dataclass(frozen=True)
class Profiled:
    """One row of the table: a shape, its counts, and its timing."""

    shape: Shape
    counts: StepCounts
    seconds: float  # the best timed forward
    samples: list[float]  # every timed forward, in order
    elapsed_s: float  # profiling it took, warm-up included

    def to_json(self) -> dict:
        return {**asdict(self.shape), **asdict(self.counts)} | {
            "seconds": self.seconds,
            "samples": self.samples,
            "elapsed_s": self.elapsed_s,
        }


@dataclass(frozen=True)
class ShapeDrift(Drift):
    """The grid's first shape timed again after its last: how far this machine's speed moved
    while the grid was profiled, which every shape's time, and so the fit, carries."""

    shape: Shape

    def line(self) -> str:
        said = (
            f"speed drift: the first shape took {self.before_s * 1e3:.3g} ms at the start and "
            f"{self.after_s * 1e3:.3g} ms after the last ({self.change:+.1%})"
        )
        if self.too_large:
            said += (
                f"; over {DRIFT_LIMIT:.0%}, the table mixes two speeds of this machine: "
                "profile again when it is quiet"
            )
        return said

    def to_json(self) -> dict:
        return {"shape": asdict(self.shape), **super().to_json()}


class ShapeTimer:
    """Times shapes (`ShapeRunner`), each row counted as the engine counts its step."""

    def __init__(self, shapes: ShapeRunner) -> None:
        self.shapes = shapes

    def profile(self, shape: Shape, repeats: int, warmup: int) -> Profiled:
        began = self.shapes.clock()
        feed, samples = self.shapes.run(shape, repeats, warmup)
        counts = StepCounts.of_shape(feed.shape)
        return Profiled(shape, counts, min(samples), samples, self.shapes.clock() - began)

    def drift(self, first: Profiled, repeats: int) -> ShapeDrift:
        """`first` (the grid's first row) timed again, now, as it was timed then."""
        again = self.profile(first.shape, repeats, warmup=0)
        return ShapeDrift(first.seconds, again.seconds, first.shape)


def check_fittable(shapes: int, field_name: str) -> None:
    if shapes < MIN_SHAPES:
        raise ConfigError(
            field_name, f"{shapes} shapes; a fit of {len(TERMS)} terms needs at least {MIN_SHAPES}"
        )


def fit_table(
    table: Sequence[Profiled], described: dict[str, str], sources: list[str]
) -> StepCostModel:
    """The step-cost model of a profiled grid: every term fitted on the shapes' best times;
    no gap between steps (the grid times forwards only)."""
    check_fittable(len(table), "profile")
    seconds_per_unit, errors = fit_counts(
        [row.counts for row in table], [row.seconds for row in table]
    )
    return StepCostModel(
        seconds_per_unit=seconds_per_unit,
        gap_s=0.0,
        described=described,
        quality=FitQuality(**asdict(errors)),
        sources=sources,
    )


def every_nth(rows: Sequence[T], n: int) -> list[T]:
    """Every `n`-th shape of a grid (or row of its table), from its first: a coarser grid."""
    return list(rows[::n])
