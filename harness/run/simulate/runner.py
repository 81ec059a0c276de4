"""A model runner that computes nothing: each forward advances a virtual clock by the step's
predicted duration (`StepTime`) and returns logits that choose token 0 for every row.

It takes the place of `ModelRunner` behind the engine (the seam `model_runner.py` names), so
the real schedulers, KV managers and admission policies plan every step as they would on
the model; only the forward is replaced. A simulated request's output is token 0 repeated,
so its length is its `max_tokens` (the workload must ignore EOS, as its lengths are the
workload's). The clock is advanced inside the forward, so the step record's `model_s` and
every timestamp the engine takes after it are virtual.
"""

from __future__ import annotations

from typing import Protocol

import torch

from servelab.engine.kv_manager import KVManager
from servelab.engine.model_runner import Feed
from servelab.harness.run.simulate.cost_model import StepCounts


class StepTime(Protocol):
    """A step's predicted seconds from its counts (`StepCostModel`, fitted on real runs, or
    `RooflineStepTime`, derived from a hardware description), and the gap between steps."""

    @property
    def gap_s(self) -> float: ...

    def step_seconds(self, counts: StepCounts) -> float: ...


class VirtualClock:
    """Seconds since the simulated run began; moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def advance_to(self, moment: float) -> None:
        self.now = max(self.now, moment)


class SimulatedRunner:
    """`run(kv, feed)` as `cost` says it would take, on `clock`."""

    def __init__(self, cost: StepTime, clock: VirtualClock) -> None:
        self.cost = cost
        self.clock = clock
        self._logits: dict[int, torch.Tensor] = {}  # rows -> zeros, made once, only ever read

    def run(self, kv: KVManager, feed: Feed) -> torch.Tensor:
        del kv
        self.clock.advance(self.cost.step_seconds(StepCounts.of_shape(feed.shape)))
        rows = len(feed.logits_rows)
        if rows not in self._logits:
            self._logits[rows] = torch.zeros(rows, 1)
        return self._logits[rows]
