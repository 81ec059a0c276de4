"""Batching strategies (`strategy.batching`): static (FasterTransformer) and iteration (Orca)."""

from harness.engine.scheduling import Scheduler
from strategies.batching.iteration import ITERATION
from strategies.batching.static import STATIC
from strategies.registry import Registry

BATCHING: Registry[Scheduler] = Registry("batching", [STATIC, ITERATION])
