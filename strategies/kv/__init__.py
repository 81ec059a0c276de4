"""KV cache strategies (`strategy.kv`): contiguous slabs and paged blocks."""

from servelab.strategies.kv.contiguous import CONTIGUOUS
from servelab.strategies.kv.paged import PAGED
from servelab.strategies.registry import Registry

KV = Registry("kv", [CONTIGUOUS, PAGED])
