"""`dense`: the checkpoint's weights as they are, in the engine dtype, through plain linears."""

from __future__ import annotations

from harness.models.weights_format import WeightsFormat
from strategies.registry import NoConfig, Option


class DenseWeights(WeightsFormat):
    """Every default of the interface: nothing prepared, plain layers, every byte read."""


DENSE = Option(
    name="dense",
    summary="the checkpoint's weights in the engine dtype",
    config=NoConfig,
    build=lambda config: DenseWeights(),
)
