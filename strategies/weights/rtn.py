"""`int4-rtn`: round to nearest, group-wise with zero points: the baseline AWQ improves on.

Every linear's weight is quantised on its own (`strategies.weights.int4_quant`), no data
involved, and packed in AutoAWQ's layout, so it is served by the same layers and kernels as
`int4-awq`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from servelab.models.load import Checkpoint, StateDict
from servelab.models.weights_format import WeightsContext
from servelab.strategies.registry import Option
from servelab.strategies.weights.int4_format import (
    LINEARS,
    Int4Config,
    Int4Weights,
    quantize_layers,
)
from servelab.strategies.weights.int4_quant import quantize

if TYPE_CHECKING:
    from servelab.strategies.factories import WeightsOption


class RtnWeights(Int4Weights):
    method = "rtn"

    def quantize(
        self, checkpoint: Checkpoint, context: WeightsContext
    ) -> tuple[StateDict, dict[str, Any]]:
        config, state = checkpoint
        assert state is not None
        group = self.config.group_size

        def per_layer(layer: int) -> dict:
            return {
                name: quantize(state[f"layers.{layer}.{name}.weight"].float(), group)
                for name in LINEARS
            }

        def progress(layers: range) -> Any:
            return tqdm(layers, desc="int4-rtn: quantising layers", disable=not context.progress)

        return quantize_layers(config, state, per_layer, progress), {}


INT4_RTN: WeightsOption = Option(
    name="int4-rtn",
    summary="int4 weights, round to nearest per group (zero points; AutoAWQ packing)",
    config=Int4Config,
    build=RtnWeights,
)
