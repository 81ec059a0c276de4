"""`dense`: the checkpoint's weights as they are, in the engine dtype.

Its linears are oneDNN-prepacked on the CPU (`kernels.linear`): the same products, without
reordering the weight on every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from servelab.base.errors import ConfigError
from servelab.kernels.linear import packed_linear
from servelab.models.load import Checkpoint
from servelab.models.weights_format import WeightsContext, WeightsFormat
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import WeightsOption


class DenseWeights(WeightsFormat):
    """Nothing prepared, every byte read; prepacked linears."""

    def linear(self, in_features: int, out_features: int, name: str) -> nn.Module:
        return packed_linear(in_features, out_features, name)

    def prepare(self, checkpoint: Checkpoint, context: WeightsContext) -> Checkpoint:
        _, state = checkpoint
        if state is not None and any(name.endswith(".qweight") for name in state):
            raise ConfigError(
                "strategy.weights", "the checkpoint is AWQ-quantised; serve it with int4-awq"
            )
        return super().prepare(checkpoint, context)


DENSE: WeightsOption = Option(
    name="dense",
    summary="the checkpoint's weights in the engine dtype",
    config=NoConfig,
    build=lambda config: DenseWeights(),
)
