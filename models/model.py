"""A Llama-family decoder that runs one packed ragged batch per call.

RMSNorm, rotary position embeddings, SwiGLU feed-forward, grouped key/value heads, tied or
untied embeddings: the architecture of Llama 2/3 and SmolLM2. The model knows nothing about
scheduling or cache management: it reads a `ForwardBatch`, hands each layer's queries, keys
and values to an attention callable that owns the KV cache access, and returns next-token
logits only for the rows the batch asks for. Linear layers come from a factory so that
quantised layers can be swapped in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from servelab.base.batch import AttentionFn, ForwardBatch


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, read from a checkpoint or a named shape."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_context: int = 4096
    tie_embeddings: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of {self.num_kv_heads}")


LinearFactory = Callable[[int, int, str], nn.Module]


def plain_linear(in_features: int, out_features: int, name: str) -> nn.Module:
    """The default factory: an unquantised linear layer without bias."""
    return nn.Linear(in_features, out_features, bias=False)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * self.weight


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables, indexed by absolute position (rotate-half convention)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` [T, H, D] by the per-token angles `cos`, `sin` [T, D/2]."""
    first, second = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, linear: LinearFactory, prefix: str) -> None:
        super().__init__()
        hidden, dim = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            dim,
        )
        self.q_proj = linear(hidden, config.num_heads * dim, f"{prefix}.q_proj")
        self.k_proj = linear(hidden, config.num_kv_heads * dim, f"{prefix}.k_proj")
        self.v_proj = linear(hidden, config.num_kv_heads * dim, f"{prefix}.v_proj")
        self.o_proj = linear(config.num_heads * dim, hidden, f"{prefix}.o_proj")
        self.scale = dim**-0.5
        self.kv_repeat = 1  # >1 stores every KV head `kv_repeat` times (the `mha` head layout)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attention: AttentionFn,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q = self.q_proj(x).view(tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if self.kv_repeat > 1:
            k = k.repeat_interleave(self.kv_repeat, dim=1)
            v = v.repeat_interleave(self.kv_repeat, dim=1)
        out = attention(q, k, v, k_cache, v_cache, batch, self.scale)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, linear: LinearFactory, prefix: str) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = linear(hidden, inner, f"{prefix}.gate_proj")
        self.up_proj = linear(hidden, inner, f"{prefix}.up_proj")
        self.down_proj = linear(inner, hidden, f"{prefix}.down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, linear: LinearFactory, index: int) -> None:
        super().__init__()
        prefix = f"layers.{index}"
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SelfAttention(config, linear, f"{prefix}.self_attn")
        self.post_attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config, linear, f"{prefix}.mlp")

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        attention: AttentionFn,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_norm(x), rope, batch, k_cache, v_cache, attention)
        return x + self.mlp(self.post_attention_norm(x))


class LayerRunner(Protocol):
    """Runs the whole decoder stack for the batches it accepts, in place of the modules (the
    fused CPU decode path, `fused_decode`; the fused GPU layers, `gpu_layers`, both beside it);
    the same function, computed faster. It takes the rotary tables whole and reads them as it
    needs (the GPU layers gather them in their kernel)."""

    def accepts(self, batch: ForwardBatch, x: torch.Tensor) -> bool: ...

    def __call__(
        self,
        x: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> torch.Tensor: ...


def embedding(vocab_size: int, hidden_size: int) -> nn.Embedding:
    """`nn.Embedding` initialised as it initialises itself (normal), but not on the meta device
    (a simulated run's model: shapes only), where there is nothing to set and where that init
    imports torch's compiler stack, a large share of a simulated run's start."""
    weight = torch.empty(vocab_size, hidden_size)
    if weight.device.type != "meta":
        nn.init.normal_(weight)
    return nn.Embedding(vocab_size, hidden_size, _weight=weight)


class LlamaModel(nn.Module):
    """Decoder stack plus embedding and LM head; `forward` returns fp32 logits.

    `layer_runner`, when set, runs the decoder stack for the batches it accepts."""

    def __init__(self, config: ModelConfig, linear: LinearFactory = plain_linear) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, linear, i) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.max_context, config.rope_theta)
        self.lm_head = linear(config.hidden_size, config.vocab_size, "lm_head")
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.layer_runner: LayerRunner | None = None

    @property
    def kv_heads_stored(self) -> int:
        """KV heads per layer that the cache must hold (native heads times any repeat)."""
        return self.config.num_kv_heads * self.layers[0].self_attn.kv_repeat

    def forward(
        self,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        attention: AttentionFn,
    ) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        runner = self.layer_runner
        if runner is not None and runner.accepts(batch, x):
            x = runner(x, self.rotary, batch, k_caches, v_caches)
        else:
            rope = self.rotary(batch.positions, x.dtype)
            for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches, strict=True):
                x = layer(x, rope, batch, k_cache, v_cache, attention)
        last = self.norm(x.index_select(0, batch.logits_indices))
        return self.lm_head(last).float()
