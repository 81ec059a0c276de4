"""The decoder stack on the GPU code path in ten launches a layer.

Module by module a decoder layer launches some fifty operators (`benchmarks/
bench_launches.py`), and on a GPU a decode step then waits on Python between kernels. With
the Triton attention, `GpuLayers` runs each layer as vLLM's and SGLang's models do:

    add_rmsnorm (residual add and norm) -> qkv product -> rotary_write_kv (rotary on queries
    and keys, keys and values into the cache) -> attention (decode: split, merge) -> o product
    -> add_rmsnorm -> gate-up product -> silu_mul -> down product

The q, k, v and the gate, up products are joined once, when the engine is built: a dense
layer's weights, or an int4 layer's packed tensors (AutoAWQ's layout, outputs along their last
dimension), concatenated, and the modules' own tensors become views into them, so both paths
read the same memory and the model's size is unchanged. It applies where every projection is
a linear layer without bias or an int4 layer whose kernel reads AutoAWQ's layout (Triton's,
the reference), and every KV head is stored once; elsewhere the modules run. The function is
the modules' (`tests/models/test_gpu_layers.py` compares the two engines token for token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from servelab.base.batch import ForwardBatch
from servelab.kernels.attention import Attention
from servelab.kernels.int4_linear import Int4Linear
from servelab.kernels.layer_triton import add_rmsnorm, rotary_write_kv, silu_mul

if TYPE_CHECKING:
    from servelab.models.model import DecoderLayer, LlamaModel, RotaryEmbedding


Product = Callable[[torch.Tensor], torch.Tensor]  # x [T, in] -> x @ W [T, out]
AWQ_LAYOUT = ("triton", "reference")  # int4 kernels whose operands are AutoAWQ's tensors


@dataclass(frozen=True)
class LayerWeights:
    """One layer's operands on the fused path."""

    input_norm: torch.Tensor
    qkv: Product  # -> [T, (Hq + 2 Hkv) D]
    o: Product
    post_attention_norm: torch.Tensor
    gate_up: Product  # -> [T, 2 inner]
    down: Product


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
            qkv = layer.qkv(h)
            q = rotary_write_kv(
                qkv, cos, sin, batch.positions, batch.slot_mapping, k_cache, v_cache,
                self.num_heads,
            )  # fmt: skip
            attended = self.attention.attend(q, k_cache, v_cache, batch, self.scale)
            o = layer.o(attended.view(attended.shape[0], -1))
            h = add_rmsnorm(o, residual, layer.post_attention_norm, self.eps)
            out = layer.down(silu_mul(layer.gate_up(h)))
        return residual if out is None else residual + out


def gpu_layers(model: LlamaModel, attention: Attention) -> GpuLayers | None:
    """The fused stack for this model, its projections joined (the modules' tensors then
    views into them), or None where it does not apply: attention not Triton's, a projection
    neither a linear layer without bias nor an int4 layer in AutoAWQ's layout, or KV heads
    stored more than once."""
    if attention.impl != "triton":
        return None
    if not all(_joinable(layer) and layer.self_attn.kv_repeat == 1 for layer in model.layers):
        return None
    return GpuLayers(model, [_joined(layer) for layer in model.layers], attention)


def _joinable(layer: DecoderLayer) -> bool:
    """Every projection one kind: a linear layer without bias (`nn.Linear` or the dense
    format's `PackedLinear`, whose packed copies serve CPU forwards only), or an int4 layer
    whose kernel reads AutoAWQ's tensors."""
    linears = (*_attention_projections(layer), *_mlp_projections(layer))
    return all(isinstance(m, nn.Linear) and m.bias is None for m in linears) or all(
        isinstance(m, Int4Linear) and m.kernel.name in AWQ_LAYOUT for m in linears
    )


def _attention_projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    attn = layer.self_attn
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj


def _mlp_projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    return layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj


def _joined(layer: DecoderLayer) -> LayerWeights:
    q, k, v, o = _attention_projections(layer)
    gate, up, down = _mlp_projections(layer)
    return LayerWeights(
        input_norm=layer.input_norm.weight,
        qkv=_product(q, k, v),
        o=_product(o),
        post_attention_norm=layer.post_attention_norm.weight,
        gate_up=_product(gate, up),
        down=_product(down),
    )


def _product(*linears: nn.Module) -> Product:
    """One product giving the linears' outputs side by side: a dense weight's rows joined, or
    an int4 kernel's operands joined along their outputs (the last dimension of each of
    AutoAWQ's tensors, whole words of eight channels)."""
    if isinstance(linears[0], nn.Linear):
        return partial(F.linear, weight=_join(linears, "weight", 0))
    kernel = linears[0].kernel
    operands = {name: _join(linears, name, -1) for name in kernel.operand_shapes()}
    joined = replace(kernel, out_features=sum(m.out_features for m in linears))
    return partial(joined.matmul, operands=operands)


def _join(linears: tuple[nn.Module, ...], name: str, dim: int) -> torch.Tensor:
    """The linears' tensor `name` concatenated along `dim`, each linear's own then a view into
    it (a parameter stays a parameter); one linear's is its own."""
    if len(linears) == 1:
        return getattr(linears[0], name)
    joined = torch.cat([getattr(m, name) for m in linears], dim)
    start = 0
    for m in linears:
        size = getattr(m, name).shape[dim]
        view = joined.narrow(dim, start, size)
        setattr(m, name, nn.Parameter(view, requires_grad=False) if name in m._parameters else view)
        start += size
    return joined
