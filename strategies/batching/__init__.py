"""Batching strategies (`strategy.batching`): static (FasterTransformer) and iteration (Orca)."""

from servelab.strategies.batching.iteration import ITERATION
from servelab.strategies.batching.static import STATIC
from servelab.strategies.registry import Registry

BATCHING = Registry("batching", [STATIC, ITERATION])
