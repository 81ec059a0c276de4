"""`gqa`: the checkpoint's own key/value heads, stored once each (SmolLM2: 3 for 9 query heads)."""

from __future__ import annotations

from harness.models.head_layout import HeadLayout
from harness.models.model import ModelConfig
from strategies.registry import NoConfig, Option


class NativeHeads(HeadLayout):
    def stored_kv_heads(self, config: ModelConfig) -> int:
        return config.num_kv_heads


NATIVE = Option(
    name="gqa",
    summary="the checkpoint's native KV heads",
    config=NoConfig,
    build=lambda config: NativeHeads(),
)
