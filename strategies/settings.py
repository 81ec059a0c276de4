"""The typed, validated view of the `strategy` config node: one checked choice per axis.

`strategy_settings` reads the node once, before any work: each axis's registry checks the
option's name and the keys that option reads, and raises a `ConfigError` naming the field
and the fix. Presets in `conf/strategy/` set every key, so any axis can be overridden alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from servelab.strategies.batching import BATCHING
from servelab.strategies.decoding import DECODING
from servelab.strategies.decoding.proposers import PROPOSERS, DraftConfig, DraftSource
from servelab.strategies.decoding.speculative import SpeculativeConfig
from servelab.strategies.factories import (
    BatchingChoice,
    DecodingChoice,
    HeadsChoice,
    KVChoice,
    PolicyChoice,
    ProposerChoice,
    WeightsChoice,
)
from servelab.strategies.heads import HEADS
from servelab.strategies.kv import KV
from servelab.strategies.policy import POLICIES
from servelab.strategies.weights import WEIGHTS

REGISTRIES = (BATCHING, POLICIES, KV, HEADS, WEIGHTS, DECODING, PROPOSERS)
AXES = tuple(registry.axis for registry in REGISTRIES)  # the proposer last: speculative only


@dataclass(frozen=True)
class StrategySettings:
    name: str
    batching: BatchingChoice
    policy: PolicyChoice
    kv: KVChoice
    heads: HeadsChoice
    weights: WeightsChoice
    decoding: DecodingChoice
    proposer: ProposerChoice  # read always, used by speculative decoding only
    draft_weights: WeightsChoice | None  # proposer=draft: the draft model's weights format

    @property
    def draft_source(self) -> DraftSource | None:
        """The proposer that drafts, when the decoding is speculative."""
        return (
            self.proposer.build() if isinstance(self.decoding.config, SpeculativeConfig) else None
        )

    @property
    def kv_block_size(self) -> int:
        """Slots per cache block under this KV strategy."""
        return int(self.kv.config.cache_block_size)

    def describe(self) -> dict[str, Any]:
        """Every axis's choice and the keys it read (what the run actually used)."""
        described: dict[str, Any] = {"name": self.name}
        for axis in AXES[:-1]:
            described.update(getattr(self, axis).describe())
        if self.draft_source is not None:
            described.update(self.proposer.describe())
        return described


def strategy_settings(node: DictConfig | dict) -> StrategySettings:
    """Every axis chosen from `node`, which names an option on each (the presets do)."""
    proposer = PROPOSERS.choose(node)
    draft_weights = None
    if isinstance(proposer.config, DraftConfig):
        draft_weights = WEIGHTS.choose({**node, "weights": proposer.config.draft_weights})
    return StrategySettings(
        name=str(node.get("name", "custom")),
        batching=BATCHING.choose(node),
        policy=POLICIES.choose(node),
        kv=KV.choose(node),
        heads=HEADS.choose(node),
        weights=WEIGHTS.choose(node),
        decoding=DECODING.choose(node),
        proposer=proposer,
        draft_weights=draft_weights,
    )
