"""The decoder stack on the GPU code path in ten launches a layer.

Module by module a decoder layer launches some fifty operators (`benchmarks/
bench_launches.py`), and on a GPU a decode step then waits on Python between kernels. With
the Triton attention, `GpuLayers` runs each layer as vLLM's and SGLang's models do:

    add_rmsnorm (residual add and norm) -> qkv product -> rotary_write_kv (rotary on queries
    and keys, keys and values into the cache) -> attention (decode: split, merge) -> o product
    -> add_rmsnorm -> gate-up product -> silu_mul -> down product

The q, k, v and the gate, up weights are concatenated once, when the engine is built, and the
modules' own weights become views into them, so both paths read the same memory and the
model's size is unchanged. It applies where every projection is a plain linear layer (not the
int4 formats yet) and every KV head is stored once; elsewhere the modules run. The function is
the modules' (`tests/test_gpu_layers.py` compares the two engines token for token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from servelab.harness.engine.batch import ForwardBatch
from servelab.kernels.attention import Attention
from servelab.kernels.layer_triton import add_rmsnorm, rotary_write_kv, silu_mul

if TYPE_CHECKING:
    from servelab.harness.models.model import DecoderLayer, LlamaModel, RotaryEmbedding


@dataclass(frozen=True)
class LayerWeights:
    """One layer's operands on the fused path."""

    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, hidden]
    o: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 inner, hidden]
    down: torch.Tensor


class GpuLayers:
    """Runs the decoder stack for every batch, with the Triton attention (`LayerRunner`)."""

    def __init__(self, model: LlamaModel, layers: list[LayerWeights], attention: Attention) -> None:
        self.layers = layers
        self.attention = attention
        self.num_heads = model.config.num_heads
        self.eps = model.config.rms_norm_eps
        self.scale = model.config.head_dim**-0.5

    def accepts(self, batch: ForwardBatch, x: torch.Tensor) -> bool:
        return True

    def __call__(
        self,
        x: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        residual, out = x, None
        cos, sin = rotary.cos, rotary.sin  # fp32 tables; the kernel gathers each token's row
        for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches, strict=True):
            h = add_rmsnorm(x if out is None else out, None if out is None else residual,
                            layer.input_norm, self.eps)  # fmt: skip
            qkv = F.linear(h, layer.qkv)
            q = rotary_write_kv(
                qkv, cos, sin, batch.positions, batch.slot_mapping, k_cache, v_cache,
                self.num_heads,
            )  # fmt: skip
            attended = self.attention.attend(q, k_cache, v_cache, batch, self.scale)
            o = F.linear(attended.view(attended.shape[0], -1), layer.o)
            h = add_rmsnorm(o, residual, layer.post_attention_norm, self.eps)
            out = F.linear(silu_mul(F.linear(h, layer.gate_up)), layer.down)
        return residual if out is None else residual + out


def gpu_layers(model: LlamaModel, attention: Attention) -> GpuLayers | None:
    """The fused stack for this model, its projections concatenated (the modules' weights
    then views into them), or None where it does not apply: attention not Triton's, a
    projection that is not a plain linear layer, or KV heads stored more than once."""
    if attention.impl != "triton":
        return None
    if not all(_plain(layer) and layer.self_attn.kv_repeat == 1 for layer in model.layers):
        return None
    return GpuLayers(model, [_concatenated(layer) for layer in model.layers], attention)


def _plain(layer: DecoderLayer) -> bool:
    """Every projection a linear layer without bias: `nn.Linear` or a subclass of it (the
    dense format's `PackedLinear`, whose packed copies serve only CPU forwards)."""
    linears = (*_attention_projections(layer), *_mlp_projections(layer))
    return all(isinstance(m, nn.Linear) and m.bias is None for m in linears)


def _attention_projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    attn = layer.self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj


def _mlp_projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    return layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj


def _concatenated(layer: DecoderLayer) -> LayerWeights:
    q, k, v, o = _attention_projections(layer)
    gate, up, down = _mlp_projections(layer)
    return LayerWeights(
        input_norm=layer.input_norm.weight,
        qkv=_share(q, k, v),
        o=o.weight,
        post_attention_norm=layer.post_attention_norm.weight,
        gate_up=_share(gate, up),
        down=down.weight,
    )


def _share(*linears: nn.Linear) -> torch.Tensor:
    """One weight of the linears' rows, each linear's own weight a view into it."""
    joined = torch.cat([m.weight for m in linears])
    start = 0
    for m in linears:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(joined[start : start + rows], requires_grad=False)
        start += rows
    return joined
