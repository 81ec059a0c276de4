"""Weight formats (`strategy.weights`): how the linear layers' weights are stored and multiplied."""

from servelab.strategies.registry import Registry
from servelab.strategies.weights.awq import INT4_AWQ
from servelab.strategies.weights.dense import DENSE
from servelab.strategies.weights.rtn import INT4_RTN

WEIGHTS = Registry("weights", [DENSE, INT4_RTN, INT4_AWQ])
