"""The warm-up before a run's measured window: an untimed forward of each step-shape bucket the
run can use, so what is built on a shape's first use (Triton's kernels, compiled per
constexpr and specialisation; oneDNN's primitives on a CPU; the allocator's pools) is built
before the first request arrives, and its time is reported apart (`meta.json`'s `warmup`)
instead of sitting in the first requests' latencies.

The buckets (`warmup_shapes`): decode batches of 1, 2, 4, ... rows up to the most the run
can batch (the strategy's `max_num_seqs`, the workload's requests), one token each after a
block of context; and single-sequence prefill chunks of 16, 32, ... tokens up to the longest
prompt (within the step's token budget), plus the longest itself. A shape the empty KV cache
cannot hold at once is skipped: the run cannot take it either. `engine.warmup=false` skips
the phase.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from tqdm import tqdm

from servelab.engine.engine import Engine
from servelab.engine.shapes import DECODE, PREFILL, NoRoom, Shape, ShapeRunner

FIRST_CHUNK = 16  # the shortest prefill bucket, tokens
DECODE_CONTEXT = 16  # tokens of context each decode row attends


@dataclass(frozen=True)
class Warmup:
    """What the warm-up ran and what it took."""

    shapes: list[Shape]  # run, in order
    skipped: list[Shape]  # more than the empty KV cache holds
    seconds: float

    def as_dict(self) -> dict:
        return {
            "shapes": [asdict(shape) for shape in self.shapes],
            "skipped": [asdict(shape) for shape in self.skipped],
            "seconds": self.seconds,
        }


def powers_up_to(first: int, last: int) -> list[int]:
    """first, 2 first, 4 first, ... below `last`, then `last` (nothing when last < 1)."""
    values, value = [], first
    while value < last:
        values.append(value)
        value *= 2
    return [*values, last] if last >= 1 else []


def warmup_shapes(max_rows: int, longest_prompt: int, token_budget: int) -> list[Shape]:
    """The decode and prefill buckets of a run (module docstring)."""
    decode = [Shape(DECODE, rows, 1, DECODE_CONTEXT) for rows in powers_up_to(1, max_rows)]
    longest = min(longest_prompt, token_budget)
    prefill = [Shape(PREFILL, 1, tokens, 0) for tokens in powers_up_to(FIRST_CHUNK, longest)]
    return decode + prefill


def warm_up(engine: Engine, vocab_size: int, shapes: list[Shape], progress: bool) -> Warmup:
    """Each shape's forward once, untimed, through the engine's own runner and KV manager."""
    runner = ShapeRunner(engine.runner, engine.kv, engine.decoder, vocab_size)
    began = time.perf_counter()
    ran, skipped = [], []
    for shape in tqdm(shapes, desc="warm-up: step shapes", unit="shape", disable=not progress):
        try:
            runner.run(shape, repeats=0, warmup=1)
        except NoRoom:
            skipped.append(shape)
            continue
        ran.append(shape)
    return Warmup(ran, skipped, time.perf_counter() - began)
