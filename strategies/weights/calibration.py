"""Calibration for AWQ: the dense model run block by block on real text, inputs summarised.

The calibration text's tokens are cut into `samples` windows of `seq_len` tokens, spread
evenly over the text. Their hidden states go through the dense model one decoder layer at a
time (each sequence attends causally to itself, no KV cache); while a layer runs, forward
pre-hooks summarise the input of each group of linears that share it (q/k/v, o, gate/up,
down) as its per-channel mean magnitude and its Gram matrix `X^T X / N`. That is all the
search needs: the output error of any candidate weight `W'` on the calibration inputs is
`trace((W' - W) G (W' - W)^T)`, so the search costs the same whatever the number of
calibration tokens, and memory holds one layer's hidden states, never its activations.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from servelab.base.errors import ConfigError
from servelab.models.model import DecoderLayer, LlamaModel

# the linear whose input each group's statistics are taken from
INPUT_POINTS = {
    "qkv": "self_attn.q_proj",
    "o": "self_attn.o_proj",
    "gate_up": "mlp.gate_proj",
    "down": "mlp.down_proj",
}
CHUNK_TOKENS = 4096  # tokens per forward while capturing: bounds activation memory


@dataclass
class InputStats:
    """One group's input over the calibration tokens."""

    mean_abs: torch.Tensor  # [in] mean |x| per input channel
    gram: torch.Tensor  # [in, in] X^T X / tokens
    tokens: int


class _Accumulator:
    """Sums |x| and X^T X of every input a linear sees (a forward pre-hook)."""

    def __init__(self, width: int, device: torch.device) -> None:
        self.abs_sum = torch.zeros(width, dtype=torch.float64, device=device)
        self.gram = torch.zeros(width, width, dtype=torch.float32, device=device)
        self.tokens = 0

    def __call__(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        del module
        x = args[0].reshape(-1, args[0].shape[-1]).float()
        self.abs_sum += x.abs().sum(0, dtype=torch.float64)
        self.gram.addmm_(x.t(), x)
        self.tokens += x.shape[0]

    def stats(self) -> InputStats:
        return InputStats(
            (self.abs_sum / self.tokens).float(), self.gram / self.tokens, self.tokens
        )


def calibration_windows(token_ids: list[int], samples: int, seq_len: int) -> torch.Tensor:
    """`samples` disjoint windows of `seq_len` tokens spread evenly over `token_ids`."""
    needed = samples * seq_len
    if needed > len(token_ids):
        raise ConfigError(
            "strategy.calibration_samples",
            f"{samples} x {seq_len} tokens asked for, the calibration text has "
            f"{len(token_ids)}; lower calibration_samples or calibration_seq_len",
        )
    ids = torch.tensor(token_ids, dtype=torch.int64)
    stride = (len(token_ids) - seq_len) // max(samples - 1, 1)
    starts = [i * stride for i in range(samples)]
    return torch.stack([ids[s : s + seq_len] for s in starts])


def causal_attention(seq_len: int):
    """Attention for packed equal-length sequences, each causal over itself, no cache."""

    def attend(q, k, v, k_cache, v_cache, batch, scale):  # noqa: ANN001, ANN202 (AttentionFn)
        del k_cache, v_cache, batch
        tokens, heads, dim = q.shape
        seqs = tokens // seq_len

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(seqs, seq_len, t.shape[1], dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(q), split(k), split(v), is_causal=True, scale=scale, enable_gqa=True
        )
        return out.transpose(1, 2).reshape(tokens, heads, dim)

    return attend


class LayerRunner:
    """Runs the dense model's layers over the calibration windows, one layer at a time."""

    def __init__(self, model: LlamaModel, windows: torch.Tensor) -> None:
        self.model = model
        self.seq_len = int(windows.shape[1])
        self.chunk = max(1, CHUNK_TOKENS // self.seq_len)  # sequences per forward
        device = model.embed_tokens.weight.device
        with torch.no_grad():
            self.hidden = model.embed_tokens(windows.to(device)).float()  # [S, L, H]
        self.attention = causal_attention(self.seq_len)

    def _chunks(self) -> Iterator[slice]:
        for start in range(0, self.hidden.shape[0], self.chunk):
            yield slice(start, start + self.chunk)

    @torch.no_grad()
    def capture(self, layer: DecoderLayer) -> dict[str, InputStats]:
        """Each group's input statistics under `layer` as it is now (dense), and advance the
        hidden states through it."""
        width = {name: layer.get_submodule(path).in_features for name, path in INPUT_POINTS.items()}
        device = self.hidden.device
        accumulators = {name: _Accumulator(width[name], device) for name in INPUT_POINTS}
        handles = [
            layer.get_submodule(INPUT_POINTS[name]).register_forward_pre_hook(acc)
            for name, acc in accumulators.items()
        ]
        try:
            for part in self._chunks():
                x = self.hidden[part]
                seqs = x.shape[0]
                positions = torch.arange(self.seq_len, device=device).repeat(seqs)
                rope = self.model.rotary(positions, x.dtype)
                out = layer(x.reshape(-1, x.shape[-1]), rope, None, None, None, self.attention)
                self.hidden[part] = out.view_as(x)
        finally:
            for handle in handles:
                handle.remove()
        return {name: acc.stats() for name, acc in accumulators.items()}
