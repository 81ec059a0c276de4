"""Decode steps on the CPU one C++ call per layer: the fused decoder layer and when it applies.

At batch 1 the eager decoder layer dispatches some twenty small operators from Python, and
that, not the weights' bytes, bounds a decode step, several times its memory floor. The
compiled operator `decode_layer` (`kernels/cpu/decode_layer.cpp`, one build per ISA level,
`kernels.cpu_build`) runs a whole layer for a batch whose sequences all have few new tokens
(decode steps and short verifications, fewer than the flash path takes, any batch size);
`FusedDecodeLayers` holds each layer's operands and runs the stack when a batch qualifies
(bfloat16 on a CPU), and the model runs its modules otherwise. Up to 8 rows its dense
products are a matrix-vector loop; beyond, the panel products of `kernels/cpu/panel_gemm.h`
on a copy of each weight packed for them, which prefetch the next weights while they
multiply. Where the build lacks AVX-512 BF16 it multiplies on oneDNN's prepacked copy
where oneDNN multiplies bfloat16, else by the matrix-vector loop at every row count. Int4
weights take the int4 loop for few rows where it pays (`int4_loop_block`), torch's int4
kernel otherwise. The engine setting `engine.fused_decode` turns it
off; the tests compare the two paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from servelab.base.batch import ForwardBatch
from servelab.kernels.capabilities import capabilities
from servelab.kernels.cpu_attention import FLASH_ROWS, plan_cpu
from servelab.kernels.cpu_build import cpu_ops
from servelab.kernels.int4_matmul_cpu import int4_loop_block
from servelab.kernels.linear import PackedLinear

if TYPE_CHECKING:
    from servelab.models.model import DecoderLayer, LlamaModel, RotaryEmbedding

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LayerOperands:
    """What `servelab::decode_layer` reads of one layer."""

    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    weights: list[torch.Tensor | None]  # per projection: weight + packed copy, or int4 + scales
    int4_groups: list[int]  # per projection: 0 for dense, else the int4 group


def projection_operands(
    module: nn.Module, ops: object
) -> tuple[list[torch.Tensor | None], int] | None:
    """A projection's two tensors for the fused layer and its int4 group (0: dense), or None
    when the fused layer cannot multiply by it. A dense weight comes with a packed copy, which
    the layer multiplies by for more than a few rows: packed into panels for its own products
    where the build has them (AVX-512 BF16), else oneDNN's prepacked copy where oneDNN
    multiplies bfloat16, else none (the matrix-vector loop takes every row count)."""
    if isinstance(module, nn.Linear):
        weight = module.weight.detach()
        if module.bias is not None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
            return None
        packed: torch.Tensor | None = None
        if ops.panel_products_available():
            packed = ops.pack_panels(weight)
        elif capabilities().onednn_bf16 and isinstance(module, PackedLinear):
            packed = module.packed_weight()  # the copy the layer already holds
        elif capabilities().onednn_bf16:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        return [weight.contiguous(), packed], 0
    kernel = getattr(module, "kernel", None)
    if kernel is not None and kernel.name == "torch-packed":
        tensors = [module.get_buffer("packed"), module.get_buffer("scales_and_offsets")]
        return tensors, kernel.cpu_group()
    return None


def layer_operands(layer: DecoderLayer, ops: object) -> LayerOperands | None:
    """One layer's operands, or None when some part of it is outside the fused layer."""
    attn, mlp = layer.self_attn, layer.mlp
    if attn.kv_repeat != 1:
        return None
    owners = (attn, attn, attn, attn, mlp, mlp, mlp)
    weights: list[torch.Tensor | None] = []
    groups: list[int] = []
    for owner, name in zip(owners, PROJECTIONS, strict=True):
        operands = projection_operands(getattr(owner, name), ops)
        if operands is None:
            return None
        weights += operands[0]
        groups.append(operands[1])
    norms = (layer.input_norm.weight, layer.post_attention_norm.weight)
    if any(norm.dtype != torch.bfloat16 for norm in norms):
        return None
    return LayerOperands(norms[0].detach(), norms[1].detach(), weights, groups)


class FusedDecodeLayers:
    """Runs a model's decoder stack one fused call per layer for batches it accepts.

    Built once per engine from the model as loaded: its weights must not be replaced later.
    """

    def __init__(self, model: LlamaModel, layers: list[LayerOperands], ops: object) -> None:
        self.layers = layers
        self.ops = ops
        self.int4_block = int4_loop_block() or 0  # 0: torch's int4 kernel for every row count
        config = model.config
        self.num_heads = config.num_heads
        self.eps = config.rms_norm_eps
        self.scale = config.head_dim**-0.5

    def accepts(self, batch: ForwardBatch, x: torch.Tensor) -> bool:
        """Whether this batch takes the fused path: bfloat16 on a CPU, every sequence with
        fewer than FLASH_ROWS new tokens (decode steps and short verifications of any batch
        size: all of it is the attention operator's)."""
        return (
            x.dtype == torch.bfloat16
            and x.device.type == "cpu"
            and max(batch.query_lens, default=0) < FLASH_ROWS
        )

    def __call__(
        self,
        x: torch.Tensor,
        rotary: RotaryEmbedding,
        batch: ForwardBatch,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
    ) -> torch.Tensor:
        plan = plan_cpu(batch, k_caches[0].shape[1])
        cos, sin = (part.contiguous() for part in rotary(batch.positions, x.dtype))
        slots = batch.slot_mapping.contiguous()
        for layer, k_cache, v_cache in zip(self.layers, k_caches, v_caches, strict=True):
            x = self.ops.decode_layer(
                x,
                layer.input_norm,
                layer.post_attention_norm,
                self.eps,
                layer.weights,
                layer.int4_groups,
                self.int4_block,
                cos,
                sin,
                k_cache,
                v_cache,
                slots,
                plan.short_query_start_loc,
                plan.short_seq_lens,
                plan.short_kv_index,
                plan.paged,
                self.num_heads,
                self.scale,
            )
        return x


def fused_decode_layers(
    model: LlamaModel, dtype: torch.dtype, device: torch.device, attention_impl: str
) -> FusedDecodeLayers | None:
    """The fused stack for this model, or None where it does not apply: another device or
    dtype, attention not on the CPU operator, a layer it cannot run, or no compiler."""
    if device.type != "cpu" or dtype != torch.bfloat16 or attention_impl != "cpu":
        return None
    ops = cpu_ops()
    if ops is None:
        return None
    operands = [layer_operands(layer, ops) for layer in model.layers]
    usable = [layer for layer in operands if layer is not None]
    if len(usable) < len(operands):
        return None
    return FusedDecodeLayers(model, usable, ops)
