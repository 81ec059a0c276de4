"""Triton int4 GEMM for CUDA: dequantise AutoAWQ-packed weights in registers and multiply.

Each program computes one `[BLOCK_M, BLOCK_N]` tile of `y = x @ W`. Along the input
dimension it loads a `[BLOCK_K, BLOCK_N]` tile of packed words (each int32 word holds eight
output channels, in AutoAWQ's nibble order), shifts and masks out each channel's nibble,
subtracts the group's zero point, multiplies by the group's scale and accumulates
`tl.dot(x_tile, w_tile)` in float32. The weights cross memory as 4-bit values: a quarter of
the bytes of a float16 weight, which is what makes small-batch decoding faster. Any `M`, `N`
(a multiple of 8) and `in` work, including a short last group; edges are masked.

The PyTorch reference is `kernels.int4_matmul_ref.int4_matmul_ref` (same arguments). On a
CPU this runs only under `TRITON_INTERPRET=1`, which is how the tests run it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
BLOCK_K = 64


@triton.jit(do_not_specialize=["M"])  # the batch's rows: one compile for every batch size
def _int4_matmul_kernel(
    x_ptr,
    qweight_ptr,
    qzeros_ptr,
    scales_ptr,
    y_ptr,
    M,
    N,
    K,
    group_size,
    stride_xm,
    stride_xk,
    stride_wk,
    stride_zg,
    stride_sg,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    words = offs_n // 8
    # channel c of each eight sits in nibble (c // 2) + 4 * (c % 2): AWQ order 0 2 4 6 1 3 5 7
    shifts = ((offs_n % 8) // 2 + (offs_n % 2) * 4) * 4
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        mask_kn = mask_k[:, None] & mask_n[None, :]
        packed = tl.load(
            qweight_ptr + offs_k[:, None] * stride_wk + words[None, :], mask=mask_kn, other=0
        )
        groups = offs_k // group_size
        zeros = tl.load(
            qzeros_ptr + groups[:, None] * stride_zg + words[None, :], mask=mask_kn, other=0
        )
        scales = tl.load(
            scales_ptr + groups[:, None] * stride_sg + offs_n[None, :], mask=mask_kn, other=0.0
        )
        q = (packed >> shifts[None, :]) & 0xF
        z = (zeros >> shifts[None, :]) & 0xF
        w = ((q - z).to(tl.float32) * scales.to(tl.float32)).to(x.dtype)
        acc += tl.dot(x, w, input_precision="ieee")
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_n[None, :],
    )


def interpreted() -> bool:
    """Whether the kernel was built for the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_int4_matmul_kernel, triton.runtime.JITFunction)


def _block_m(rows: int) -> int:
    """Row tile: 16 (the smallest `tl.dot` takes) for decode-sized batches, up to 64."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def int4_matmul_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """`x` `[M, in]` times the int4 weight `[in, out]` -> `[M, out]` in `x`'s dtype."""
    rows, in_features = x.shape
    out_features = scales.shape[1]
    y = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    block_m = _block_m(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(out_features, BLOCK_N))
    _int4_matmul_kernel[grid](
        x,
        qweight,
        qzeros,
        scales,
        y,
        rows,
        out_features,
        in_features,
        group_size,
        x.stride(0),
        x.stride(1),
        qweight.stride(0),
        qzeros.stride(0),
        scales.stride(0),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    return y
