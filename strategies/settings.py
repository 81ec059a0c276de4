"""The typed, validated view of the `strategy` config node: one checked choice per axis.

`strategy_settings` reads the node once, before any work: each axis's registry checks the
option's name and the keys that option reads, and raises a `ConfigError` naming the field
and the fix. Presets in `conf/strategy/` set every key, so any axis can be overridden alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from harness.engine.decoding import Decoder
from harness.engine.kv_manager import KVManager
from harness.engine.scheduling import AdmissionPolicy, Scheduler
from harness.models.head_layout import HeadLayout
from harness.models.weights_format import WeightsFormat
from strategies.batching import BATCHING
from strategies.decoding import DECODING
from strategies.heads import HEADS
from strategies.kv import KV
from strategies.policy import POLICIES
from strategies.registry import Choice
from strategies.weights import WEIGHTS


@dataclass(frozen=True)
class StrategySettings:
    name: str
    batching: Choice[Scheduler]
    policy: Choice[AdmissionPolicy]
    kv: Choice[KVManager]
    heads: Choice[HeadLayout]
    weights: Choice[WeightsFormat]
    decoding: Choice[Decoder]

    @property
    def kv_block_size(self) -> int:
        """Slots per cache block under this KV strategy."""
        return int(self.kv.config.cache_block_size)

    def describe(self) -> dict[str, Any]:
        """Every axis's choice and the keys it read (what the run actually used)."""
        described: dict[str, Any] = {"name": self.name}
        for axis in ("batching", "policy", "kv", "heads", "weights", "decoding"):
            described.update(getattr(self, axis).describe())
        return described


def strategy_settings(node: DictConfig | dict) -> StrategySettings:
    return StrategySettings(
        name=str(node.get("name", "custom")),
        batching=BATCHING.choose(node),
        policy=POLICIES.choose(node, "fcfs"),
        kv=KV.choose(node),
        heads=HEADS.choose(node, "gqa"),
        weights=WEIGHTS.choose(node, "dense"),
        decoding=DECODING.choose(node, "standard"),
    )
