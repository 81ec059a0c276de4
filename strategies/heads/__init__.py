"""Head layouts (`strategy.heads`): how many KV heads the cache stores per layer."""

from servelab.strategies.heads.native import NATIVE
from servelab.strategies.heads.regrouped import GQA_N, MHA, MQA
from servelab.strategies.registry import Registry

HEADS = Registry("heads", [NATIVE, MHA, MQA, GQA_N])
