"""`gqa`: the checkpoint's own key/value heads, stored once each (SmolLM2: 3 for 9 query heads)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.models.head_layout import HeadLayout
from servelab.models.model import ModelConfig
from servelab.strategies.registry import NoConfig, Option

if TYPE_CHECKING:
    from servelab.strategies.factories import HeadsOption


class NativeHeads(HeadLayout):
    def stored_kv_heads(self, config: ModelConfig) -> int:
        return config.num_kv_heads


NATIVE: HeadsOption = Option(
    name="gqa",
    summary="the checkpoint's native KV heads",
    config=NoConfig,
    build=lambda config: NativeHeads(),
)
