"""Weight formats (`strategy.weights`): how the linear layers' weights are stored and multiplied."""

from harness.models.weights_format import WeightsFormat
from strategies.registry import Registry
from strategies.weights.dense import DENSE

WEIGHTS: Registry[WeightsFormat] = Registry("weights", [DENSE])
