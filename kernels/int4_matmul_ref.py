"""The int4 matrix product in plain PyTorch: unpack AutoAWQ's layout, dequantise, multiply.

`y = x @ W` with `W` stored as in `kernels.int4_layout`. The Triton kernel is checked
against this; it is also what runs where no faster path applies (on a CPU in float32, where
the result must be the quantised model's exact function, for quality measurements).
"""

from __future__ import annotations

import torch

from servelab.kernels.int4_layout import dequantize


def int4_matmul_ref(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """`x` `[M, in]` times the int4 weight `[in, out]` -> `[M, out]` in `x`'s dtype."""
    return x @ dequantize(qweight, qzeros, scales, group_size, x.dtype)
