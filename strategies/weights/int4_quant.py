"""Group-wise asymmetric int4 quantisation of a linear weight, and its AutoAWQ packing.

A weight `W` `[out, in]` is cut along the input dimension into groups of `group_size` (the
last one shorter when `group_size` does not divide `in`). Each (output channel, group) gets
a scale `(max - min) / 15`, rounded to float16 as it is stored, and an integer zero point
`round(-min / scale)` in 0..15; values are `clamp(round(w / scale) + zero, 0, 15)` and
dequantise to `(q - zero) * scale`. An optional clip bound per (channel, group) clamps the
weights to `[-bound, bound]` first (AWQ's clipping search chooses it). Rounding the scale to
float16 before computing the zero points and values makes the search see exactly the
weights that are served.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from servelab.kernels.int4_layout import num_groups, pack_int4

MAX_Q = 15


@dataclass
class QuantizedWeight:
    """One linear's int4 values, `[out, in]` orientation (before packing)."""

    values: torch.Tensor  # [out, in] integers in 0..15
    zeros: torch.Tensor  # [out, groups] integers in 0..15
    scales: torch.Tensor  # [out, groups] float32 holding float16 values
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """The served weight `[out, in]` in float32."""
        per_column = torch.arange(self.values.shape[1], device=self.values.device)
        group = per_column // self.group_size
        return (self.values.float() - self.zeros[:, group]) * self.scales[:, group]

    def packed(self) -> dict[str, torch.Tensor]:
        """AutoAWQ's GEMM tensors: `qweight`, `qzeros`, `scales` (see `kernels.int4_layout`)."""
        return {
            "qweight": pack_int4(self.values.t().contiguous()),
            "qzeros": pack_int4(self.zeros.t().contiguous()),
            "scales": self.scales.t().contiguous().to(torch.float16),
        }


def grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """`[out, in]` -> `[out, groups, group_size]`; a short last group is padded by repeating
    its last column, which leaves its minimum and maximum unchanged."""
    out_features, in_features = weight.shape
    pad = num_groups(in_features, group_size) * group_size - in_features
    if pad:
        weight = F.pad(weight.unsqueeze(0), (0, pad), mode="replicate").squeeze(0)
    return weight.view(out_features, -1, group_size)


def _quantize_groups(
    groups: torch.Tensor, clip: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, zeros, scales) of grouped weights `[out, groups, group_size]`, as floats;
    the one definition both the served weights and the search's candidates come from."""
    if clip is not None:
        bound = clip.unsqueeze(-1)
        groups = torch.maximum(torch.minimum(groups, bound), -bound)
    low, high = torch.aminmax(groups, dim=-1, keepdim=True)
    scales = ((high - low).clamp_(min=1e-5) / MAX_Q).to(torch.float16).float()
    zeros = torch.round(low / scales).neg_().clamp_(0, MAX_Q)
    values = torch.round(groups / scales).add_(zeros).clamp_(0, MAX_Q)
    return values, zeros, scales


def quantize(
    weight: torch.Tensor, group_size: int, clip: torch.Tensor | None = None
) -> QuantizedWeight:
    """Quantise `weight` `[out, in]` (float32); `clip` `[out, groups]` bounds |w| first."""
    in_features = weight.shape[1]
    values, zeros, scales = _quantize_groups(grouped(weight.float(), group_size), clip)
    return QuantizedWeight(
        values.flatten(1)[:, :in_features].to(torch.uint8),
        zeros.squeeze(-1).to(torch.uint8),
        scales.squeeze(-1),
        group_size,
    )


def fake_quantize(
    weight: torch.Tensor, group_size: int, clip: torch.Tensor | None = None
) -> torch.Tensor:
    """`weight` `[out, in]` as it is served after int4 quantisation, in float32."""
    values, zeros, scales = _quantize_groups(grouped(weight.float(), group_size), clip)
    return values.sub_(zeros).mul_(scales).flatten(1)[:, : weight.shape[1]]
