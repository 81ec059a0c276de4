"""`dense`: the checkpoint's weights as they are, in the engine dtype, through plain linears."""

from __future__ import annotations

from harness.errors import ConfigError
from harness.models.load import Checkpoint
from harness.models.weights_format import WeightsContext, WeightsFormat
from strategies.registry import NoConfig, Option


class DenseWeights(WeightsFormat):
    """Every default of the interface: nothing prepared, plain layers, every byte read."""

    def prepare(self, checkpoint: Checkpoint, context: WeightsContext) -> Checkpoint:
        _, state = checkpoint
        if state is not None and any(name.endswith(".qweight") for name in state):
            raise ConfigError(
                "strategy.weights", "the checkpoint is AWQ-quantised; serve it with int4-awq"
            )
        return super().prepare(checkpoint, context)


DENSE = Option(
    name="dense",
    summary="the checkpoint's weights in the engine dtype",
    config=NoConfig,
    build=lambda config: DenseWeights(),
)
