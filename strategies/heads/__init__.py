"""Head layouts (`strategy.heads`): how many KV heads the cache stores per layer."""

from strategies.heads.native import NATIVE
from strategies.heads.regrouped import GQA_N, MHA, MQA
from strategies.registry import Registry

HEADS = Registry("heads", [NATIVE, MHA, MQA, GQA_N])
