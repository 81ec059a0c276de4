"""Batching strategies (`strategy.batching`): static (FasterTransformer) and iteration (Orca)."""

from strategies.batching.iteration import ITERATION
from strategies.batching.static import STATIC
from strategies.registry import Registry

BATCHING = Registry("batching", [STATIC, ITERATION])
