"""`mha`, `mqa`, `gqa-N`: the cache stores a chosen number of KV heads instead of the native ones.

Below the native count, the checkpoint's key and value projections are mean-pooled within
groups of native heads (Ainslie et al.'s conversion, without the uptraining): `mqa` is one
head, `gqa-N` is N. Above it, each native head is stored once per query head of its group,
as a server without grouped-query support does: `mha` is one KV head per query head, the
same math in a bigger cache; a `gqa-N` above the native count is stored the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from servelab.base.errors import ConfigError
from servelab.models.head_layout import HeadLayout
from servelab.models.load import Checkpoint
from servelab.models.model import ModelConfig
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import HeadsOption

GROUP_COUNT = re.compile(r"gqa-[1-9][0-9]*")


class RegroupedHeads(HeadLayout):
    def __init__(self, name: str, heads: int | None) -> None:
        self.name = name
        self.heads = heads  # None: one per query head (mha)

    def stored_kv_heads(self, config: ModelConfig) -> int:
        target = config.num_heads if self.heads is None else self.heads
        native = config.num_kv_heads
        fits = config.num_heads % target == 0 and (
            native % target == 0 if target <= native else target % native == 0
        )
        if not fits:
            raise ConfigError(
                "strategy.heads",
                f"{self.name} needs a head count dividing {config.num_heads} query heads and "
                f"compatible with {native} native KV heads; try mqa, gqa or mha",
            )
        return target

    def convert(self, checkpoint: Checkpoint) -> Checkpoint:
        """Mean-pool K and V projections within groups of native heads, when fewer are stored."""
        config, state = checkpoint
        target = min(self.stored_kv_heads(config), config.num_kv_heads)
        if target == config.num_kv_heads:
            return checkpoint
        if state is None:  # random weights: only the shape changes
            return replace(config, num_kv_heads=target), None
        group = config.num_kv_heads // target
        pooled = dict(state)
        for name, tensor in state.items():
            if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
                heads = tensor.view(target, group, config.head_dim, tensor.shape[-1])
                pooled[name] = heads.mean(dim=1).reshape(target * config.head_dim, -1)
        return replace(config, num_kv_heads=target), pooled


@dataclass(frozen=True)
class HeadCountConfig:
    heads: str  # gqa-N, as configured

    @property
    def count(self) -> int:
        return int(self.heads[4:])


MHA: HeadsOption = Option(
    name="mha",
    summary="one KV head per query head (no grouped-query support)",
    config=NoConfig,
    build=lambda config: RegroupedHeads("mha", None),
)
MQA: HeadsOption = Option(
    name="mqa",
    summary="one KV head, pooled from the native ones",
    config=NoConfig,
    build=lambda config: RegroupedHeads("mqa", 1),
)
GQA_N: HeadsOption = Option(
    name="gqa-N",
    summary="N KV heads, pooled from (or repeating) the native ones",
    config=HeadCountConfig,
    build=lambda config: RegroupedHeads(config.heads, config.count),
    accepts=lambda value: GROUP_COUNT.fullmatch(value) is not None,
)
