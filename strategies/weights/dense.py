"""`dense`: the checkpoint's weights as they are, in the engine dtype.

Its linears are oneDNN-prepacked on the CPU (`kernels.linear`): the same products, without
reordering the weight on every call.
"""

from __future__ import annotations

from torch import nn

from harness.models.weights_format import WeightsFormat
from kernels.linear import packed_linear
from strategies.registry import NoConfig, Option


class DenseWeights(WeightsFormat):
    """Nothing prepared, every byte read; prepacked linears."""

    def linear(self, in_features: int, out_features: int, name: str) -> nn.Module:
        return packed_linear(in_features, out_features, name)


DENSE = Option(
    name="dense",
    summary="the checkpoint's weights in the engine dtype",
    config=NoConfig,
    build=lambda config: DenseWeights(),
)
