"""Weight formats (`strategy.weights`): how the linear layers' weights are stored and multiplied."""

from strategies.registry import Registry
from strategies.weights.awq import INT4_AWQ
from strategies.weights.dense import DENSE
from strategies.weights.rtn import INT4_RTN

WEIGHTS = Registry("weights", [DENSE, INT4_RTN, INT4_AWQ])
