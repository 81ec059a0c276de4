"""The int4 matrix products on a CPU: torch's own packed int4 kernel, and fp32 panels.

torch ships a CPU kernel for 4-bit weights (`aten._weight_int4pack_mm_for_cpu`) that reads
its own packing (`aten._convert_weight_to_int4pack_for_cpu`: uint8 `[out, in / 2]`) and one
`[in / g, out, 2]` tensor of (scale, offset) pairs, dequantising `(q - 8) * scale + offset`.
AutoAWQ's integer zero point `z` becomes the offset `(8 - z) * scale`, so the product is the
same weight. Its group `g` must be 32, 64, 128 or 256 and divide `in`: a group size that does
not divide `in` (128 on a 576-wide input) is served with `g = gcd(in, group_size)`, each
group's scale and offset repeated. Measured fastest on the development CPU in bfloat16 (see
`benchmarks/bench_int4.py`); in float16 and float32 it is slower than the reference.

torch's packing follows its own vector ISA (blocks of 64 outputs with AVX-512, 32 with AVX2;
`Capabilities.torch_int4_block` finds which). For at most `MATVEC_ROWS` rows in bfloat16
(decode steps) with outputs a multiple of that block, the same packed bytes go through the
compiled `int4_matvec` (`kernels/cpu/int4_matvec.cpp`, the loop the fused decoder layer uses),
twice as fast as torch's kernel at batch 1 on the development CPU (a 1536 x 576 weight: 15 us
against 30).

In float32 the compiled `int4_panel_linear_f32` (`kernels/cpu/panel_gemm_f32.cpp`) reads the
values as nibbles on the 16-column panels of the dense fp32 product, dequantises a panel at a
time and multiplies it as the dense layer would: bit for bit the dense product of the
dequantised weight, at an eighth of its bytes (`to_cpu_panels` packs them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from servelab.kernels.capabilities import capabilities
from servelab.kernels.cpu_build import cpu_ops
from servelab.kernels.int4_layout import unpack_int4

CPU_GROUP_SIZES = (32, 64, 128, 256)
PANEL_COLUMNS = 16  # the fp32 panels' width (kernels/cpu/panel_gemm_f32.cpp)
MATVEC_ROWS = 4  # at most this many rows take the compiled int4_matvec
FAST_LOOP_BLOCK = 64  # the packing block its byte-permute branch reads


def cpu_group_size(in_features: int, group_size: int) -> int | None:
    """The group the CPU kernel serves this shape with, or None when it cannot."""
    group = math.gcd(in_features, group_size)
    return group if group in CPU_GROUP_SIZES else None


def cpu_packed_available() -> bool:
    """Whether this torch build has the CPU int4 kernel."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def to_cpu_packed(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> (packed weight, scales and offsets) for the CPU kernel in `dtype`."""
    in_features = qweight.shape[0]
    group = cpu_group_size(in_features, group_size)
    if group is None:
        raise ValueError(f"no CPU int4 group for in={in_features}, group_size={group_size}")
    values = unpack_int4(qweight).t().contiguous().to(torch.int32)  # [out, in]
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 2)
    source = torch.arange(in_features // group) * group // group_size
    step = scales.to(torch.float32)[source]
    zeros = unpack_int4(qzeros).to(torch.float32)[source]
    pairs = torch.stack((step, (8.0 - zeros) * step), dim=-1)
    return packed, pairs.to(dtype).contiguous()


def to_cpu_panels(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ tensors -> (nibbles [P, in, 8] uint8, zero points and scales [P, groups, 16]
    float32) on panels of 16 outputs, the last one zero-padded, for `int4_panel_linear_f32`."""
    values = unpack_int4(qweight)  # [in, out]
    out_features = values.shape[1]
    panels = -(-out_features // PANEL_COLUMNS)

    def by_panel(t: torch.Tensor) -> torch.Tensor:  # [rows, out] -> [panels, rows, 16]
        padded = F.pad(t, (0, panels * PANEL_COLUMNS - out_features))
        return padded.view(t.shape[0], panels, PANEL_COLUMNS).transpose(0, 1).contiguous()

    lines = by_panel(values)
    half = PANEL_COLUMNS // 2
    nibbles = (lines[..., :half] | (lines[..., half:] << 4)).contiguous()
    return nibbles, by_panel(unpack_int4(qzeros).float()), by_panel(scales.float())


def int4_loop_block() -> int | None:
    """torch's int4 packing block where the compiled int4 loop pays, else None (torch's kernel).

    It pays on its byte-permute branch (AVX-512 BF16 and VBMI, blocks of 64): twice torch's
    speed at batch 1. Its portable branch is correct at every level and tested there, but
    without those byte permutes it is several times slower than torch's AVX2 kernel, so it is
    not dispatched there (`python -m benchmarks.bench_int4_loop` times both)."""
    caps = capabilities()
    if caps.level == "avx512-bf16" and caps.torch_int4_block == FAST_LOOP_BLOCK:
        return FAST_LOOP_BLOCK
    return None


def int4_matmul_cpu(
    x: torch.Tensor, packed: torch.Tensor, scales_and_offsets: torch.Tensor, group: int
) -> torch.Tensor:
    """`x` `[M, in]` times the packed weight -> `[M, out]` in `x`'s dtype."""
    block = int4_loop_block()
    if x.shape[0] <= MATVEC_ROWS and x.dtype == torch.bfloat16 and block is not None:
        ops = cpu_ops()
        if ops is not None and scales_and_offsets.shape[1] % block == 0:
            return ops.int4_matvec(x, packed, scales_and_offsets, group, block)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, scales_and_offsets)
