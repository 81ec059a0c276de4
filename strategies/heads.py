"""The head-layout axis: how many key/value heads the KV cache stores per layer.

- `gqa`: the checkpoint's native KV heads (SmolLM2: 3 for 9 query heads).
- `mha`: one KV head per query head, each native head stored once per query head of its
  group, as a server without grouped-query support would: the same math, a bigger cache.
- `mqa` / `gqa-N`: the checkpoint's key and value projections mean-pooled within groups of
  native heads down to 1 or N heads (Ainslie et al.'s conversion, without uptraining); an
  N above the native count stores native heads repeated, like `mha`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.errors import ConfigError
from harness.models.load import Checkpoint
from harness.models.model import LlamaModel, ModelConfig


@dataclass(frozen=True)
class HeadLayout:
    kind: str  # "gqa" | "mha" | "mqa" | "gqa-N"
    heads: int | None = None  # N for gqa-N (1 for mqa)

    @staticmethod
    def parse(text: str) -> HeadLayout:
        if text in ("gqa", "mha"):
            return HeadLayout(text)
        if text == "mqa":
            return HeadLayout("mqa", 1)
        if text.startswith("gqa-") and text[4:].isdigit() and int(text[4:]) > 0:
            return HeadLayout(text, int(text[4:]))
        raise ConfigError("strategy.heads", f"{text!r} is not one of mha, gqa, mqa, gqa-N")

    def stored_heads(self, config: ModelConfig) -> int:
        """KV heads per layer the cache stores under this layout."""
        if self.kind == "gqa":
            return config.num_kv_heads
        if self.kind == "mha":
            return config.num_heads
        return self.heads

    def pooled_heads(self, config: ModelConfig) -> int:
        """KV heads the converted checkpoint computes (before any storage repeat)."""
        return min(self.stored_heads(config), config.num_kv_heads)

    def check(self, config: ModelConfig) -> None:
        target = self.stored_heads(config)
        native = config.num_kv_heads
        fits = config.num_heads % target == 0 and (
            native % target == 0 if target <= native else target % native == 0
        )
        if not fits:
            raise ConfigError(
                "strategy.heads",
                f"{self.kind} needs a head count dividing {config.num_heads} query heads and "
                f"compatible with {native} native KV heads; try mqa, gqa or mha",
            )

    def apply(self, model: LlamaModel) -> None:
        """Set the storage repeat on every attention layer (after the model is built)."""
        repeat = self.stored_heads(model.config) // model.config.num_kv_heads
        for layer in model.layers:
            layer.self_attn.kv_repeat = max(repeat, 1)


def convert_checkpoint(checkpoint: Checkpoint, layout: HeadLayout) -> Checkpoint:
    """Mean-pool K and V projections within groups of native heads when the layout has fewer."""
    config, state = checkpoint
    layout.check(config)
    target = layout.pooled_heads(config)
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
