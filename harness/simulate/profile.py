"""A step-cost model from a grid of step shapes timed on the real model (`servelab
profile-steps`), rather than from whatever shapes real runs happened to serve.

A shape is `rows` sequences that each feed `new_tokens` tokens after `cached` tokens already
in the KV cache: prefill chunks (one sequence, many tokens, after an empty or a filled
cache) and decode batches (many sequences, one token each, at a context length). Each shape
is fed to the model runner on requests made up for it (random token ids; slots taken from
the KV manager and given back after) and its logits sampled, which is what a step record's
`model_s` times; its time is the best of `repeats` after `warmup` untimed forwards. Its
counts are the engine's own (`StepShape` of the feed, `StepCounts`), so the table and a
run's steps are counted alike and fitted by the one function (`fit_counts`).

In every shape each sequence's next token is due, so `seqs` and `logits_rows` move together
and the fit splits their cost evenly; and the grid times forwards only: the loop's
bookkeeping around a step (scheduling, the update, the record: about 0.15 ms of a 30 ms step
of SmolLM2-135M in fp32 on a CPU) and the gap between steps are not in it (`gap_s` is 0).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from harness.engine.decoding import Decoder, Verification
from harness.engine.kv_manager import KVManager
from harness.engine.model_runner import Feed, Runner
from harness.engine.request import Request, SamplingParams
from harness.engine.step_update import StepShape
from harness.errors import ConfigError
from harness.simulate.cost_model import TERMS, FitQuality, StepCostModel, StepCounts, fit_counts

TABLE_SCHEMA = 1
MIN_SHAPES = len(TERMS)  # a fit of every term needs at least as many shapes as terms
PREFILL = "prefill"
DECODE = "decode"
T = TypeVar("T")


@dataclass(frozen=True)
class Shape:
    """`rows` sequences, each feeding `new_tokens` tokens after `cached` computed ones."""

    kind: str  # prefill | decode
    rows: int
    new_tokens: int
    cached: int

    @property
    def context(self) -> int:
        """Each sequence's context after the step."""
        return self.cached + self.new_tokens

    def feed(self, requests: list[Request]) -> Feed:
        """What the step feeds for `requests` (one per row, each holding `context` tokens)."""
        return Feed(
            requests=requests,
            starts=[self.cached] * self.rows,
            counts=[self.new_tokens] * self.rows,
            ids=[t for r in requests for t in r.prompt_ids[self.cached :]],
            logits_rows=[(row + 1) * self.new_tokens - 1 for row in range(self.rows)],
        )


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


class ShapeTimer:
    """Times shapes through `runner` over `kv`, sampling with `decoder` as a step does."""

    def __init__(
        self,
        runner: Runner,
        kv: KVManager,
        decoder: Decoder,
        vocab_size: int,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.decoder = decoder
        self.vocab_size = vocab_size
        self.random = random.Random(seed)
        self.clock = clock
        self.made = 0  # requests made up so far

    def profile(self, shape: Shape, repeats: int, warmup: int) -> Profiled:
        began = self.clock()
        requests = [self._admitted(shape) for _ in range(shape.rows)]
        feed = shape.feed(requests)
        due = [Verification(request, 0) for request in requests]
        try:
            for request in requests:
                request.num_computed_tokens = shape.cached
            for _ in range(warmup):
                self._forward(feed, due)
            samples = [self._forward(feed, due) for _ in range(repeats)]
        finally:
            for request in requests:
                request.num_computed_tokens = 0  # nothing was computed for the KV manager
                self.kv.free(request)
        counts = StepCounts.of_shape(StepShape.of(feed))
        return Profiled(shape, counts, min(samples), samples, self.clock() - began)

    def _admitted(self, shape: Shape) -> Request:
        """A request of `context` random tokens, slots held for all of them."""
        self.made += 1
        prompt = [self.random.randrange(self.vocab_size) for _ in range(shape.context)]
        request = Request(str(self.made), prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        if not self.kv.admit(request) or not self.kv.grow(request, shape.context):
            raise RuntimeError(f"the KV cache has no room for a row of {shape}")
        return request

    def _forward(self, feed: Feed, due: list[Verification]) -> float:
        start = self.clock()
        self.decoder.accept(self.runner.run(self.kv, feed), due)
        return self.clock() - start


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
