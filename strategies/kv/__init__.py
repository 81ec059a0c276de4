"""KV cache strategies (`strategy.kv`): contiguous slabs and paged blocks."""

from strategies.kv.contiguous import CONTIGUOUS
from strategies.kv.paged import PAGED
from strategies.registry import Registry

KV = Registry("kv", [CONTIGUOUS, PAGED])
