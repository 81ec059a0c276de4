"""KV cache strategies (`strategy.kv`): contiguous slabs and paged blocks."""

from harness.engine.kv_manager import KVManager
from strategies.kv.contiguous import CONTIGUOUS
from strategies.kv.paged import PAGED
from strategies.registry import Registry

KV: Registry[KVManager] = Registry("kv", [CONTIGUOUS, PAGED])
