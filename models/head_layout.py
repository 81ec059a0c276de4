"""The interface of the heads axis: how many key/value heads the KV cache stores per layer.

A head layout may rewrite the checkpoint's key and value projections (mean-pooling heads, as
converting to MQA or fewer GQA groups does) and may have each computed head stored several
times (a server without grouped-query support stores one KV head per query head). It does
both before and after the model is built: `convert` on the checkpoint, `apply` on the model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from servelab.models.load import Checkpoint
from servelab.models.model import LlamaModel, ModelConfig


class HeadLayout(ABC):
    """What the loader and the KV cache need from a head layout."""

    @abstractmethod
    def stored_kv_heads(self, config: ModelConfig) -> int:
        """KV heads per layer the cache stores for a checkpoint of `config`'s shape."""

    def convert(self, checkpoint: Checkpoint) -> Checkpoint:
        """The checkpoint with the key/value projections this layout computes (as is by
        default)."""
        return checkpoint

    def apply(self, model: LlamaModel) -> None:
        """Set how often each computed KV head is stored, on every attention layer."""
        repeat = self.stored_kv_heads(model.config) // model.config.num_kv_heads
        for layer in model.layers:
            layer.self_attn.kv_repeat = max(repeat, 1)
