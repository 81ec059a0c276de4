"""Build a strategy's parts from its settings: the KV manager and the scheduler.

The one place that maps the strategy axes to classes, so a new option is one entry here.
"""

from __future__ import annotations

from harness.engine.kv_cache import KVCache
from harness.engine.kv_manager import KVManager
from harness.errors import ConfigError
from harness.runner.settings import StrategySettings
from strategies.batching.base import Scheduler, SchedulerLimits
from strategies.batching.iteration import IterationScheduler
from strategies.batching.static import StaticScheduler
from strategies.kv.contiguous import ContiguousKVManager


def kv_block_size(strategy: StrategySettings) -> int:
    """Slots per cache block: contiguous KV is addressed slot by slot."""
    return strategy.block_size if strategy.kv == "paged" else 1


def build_kv_manager(strategy: StrategySettings, cache: KVCache) -> KVManager:
    if strategy.kv == "contiguous":
        return ContiguousKVManager(cache.num_slots)
    if strategy.kv == "paged":
        from strategies.kv.paged import PagedKVManager

        return PagedKVManager(
            cache.num_blocks, cache.block_size, strategy.prefix_caching, strategy.preemption, cache
        )
    raise ConfigError("strategy.kv", f"{strategy.kv!r} is not one of contiguous, paged")


def build_scheduler(
    strategy: StrategySettings, kv: KVManager, limits: SchedulerLimits
) -> Scheduler:
    if strategy.batching == "static":
        return StaticScheduler(kv, limits)
    if strategy.batching == "iteration":
        return IterationScheduler(kv, limits)
    raise ConfigError("strategy.batching", f"{strategy.batching!r} is not one of static, iteration")
