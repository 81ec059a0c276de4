"""Triton int4 products for CUDA: dequantise AutoAWQ-packed weights in registers and multiply.

Both load each step's packed words once each, a `[BLOCK_K, BLOCK_N / 8]` tile (each int32
word holds eight output channels, in AutoAWQ's nibble order), shift and mask each channel's
nibble out in registers (`_dequantised`), subtract the group's zero point and multiply by the
group's scale; where the group size is a multiple of the step (AutoAWQ's 128 and 64 always),
every row of a step is in one group, and its zero points and scales are loaded once, a row
of them, not once a row. Up to `GEMV_ROWS` rows (decode batches) a GEMV runs
(`_int4_gemv_kernel`): each program takes one column tile and one slice of the input
dimension and accumulates `x * w` in float32. Beyond that the tiled GEMM runs
(`_int4_matmul_kernel`): each program computes one `[BLOCK_M, BLOCK_N]` tile of `y = x @ W`
over its slice, accumulating `tl.dot(x_tile, w_tile)` in float32. The weights cross memory as
4-bit values: a quarter of the bytes of a float16 weight, which is what makes small-batch
decoding faster. Any `M`, `N` (a multiple of 8) and `in` work, including a short last group
and groups a step straddles; edges are masked.

Both split the input dimension into slices when their output tiles alone would leave the GPU
idle (`_slices`: about `PROGRAMS_PER_SM` programs a multiprocessor): a layer of 576 outputs
has nine column tiles, and a GPU over a hundred multiprocessors. The same launch adds the
slices (`_fold_slices`), as the split-K GEMMs of CUTLASS and Marlin fix up their partial
tiles: each program stores its partial sums and counts itself in on its tile's counter, and
the program that arrives last adds every slice's partials in slice order (the sum is the same
whichever program that is), casts, writes the tile and puts the counter back to zero for the
next launch. The count is ordered after the partials by a barrier across the program's
threads and the atomic's release, and the last program's reads after it by the atomic's
acquire; they read through the L2 cache (`.cg`). The counters are one zeroed buffer a device
(`_counters`), which a launch leaves zeroed: launches on one stream at a time, as a step's
are. A GEMM in one slice writes its tile directly.

A program's tile (`Tiles`: output channels, input rows a step, warps) is a launch argument,
`GEMV_TILES` and `GEMM_TILES` by default; `benchmarks/bench_int4.py --tiles` times others on a
GPU, so that a measurement, not a guess, sets the defaults. Every tiling gives the reference's
product; the order of the sums, and so the last bits, is the tiling's.

The PyTorch reference is `kernels.int4_matmul_ref.int4_matmul_ref` (same arguments). On a
CPU this runs only under `TRITON_INTERPRET=1`, which is how the tests run it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from servelab.kernels.capabilities import multiprocessors


@dataclass(frozen=True)
class Tiles:
    """What one program takes a step: `block_n` output channels (whole packed words of 8) by
    `block_k` input rows, run by `num_warps` warps; each a power of two."""

    block_n: int
    block_k: int
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name, value, least in (("block_n", self.block_n, 16), ("block_k", self.block_k, 16),
                                   ("num_warps", self.num_warps, 1)):  # fmt: skip
            if value < least or value & (value - 1):
                raise ValueError(f"{name} must be a power of two of at least {least}, not {value}")

    @classmethod
    def parse(cls, text: str) -> Tiles:
        """`NxK` or `NxKxW`, e.g. `128x32x8`."""
        parts = text.split("x")
        if not 2 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
            raise ValueError(f"tiles are NxK or NxKxW (e.g. 128x32x8), not {text!r}")
        return cls(*(int(part) for part in parts))

    def __str__(self) -> str:
        return f"{self.block_n}x{self.block_k}x{self.num_warps}"


GEMV_ROWS = 8  # rows up to which the GEMV runs
GEMV_TILES = Tiles(block_n=64, block_k=32)  # a step: x [rows, 32], packed words [32, 8]
GEMM_TILES = Tiles(block_n=64, block_k=64)
PROGRAMS_PER_SM = 4  # a split fills about this many programs per multiprocessor
COUNTERS = 4096  # the arrival counters made at first: output tiles a split launch may have


@triton.jit
def _fold_slices(acc, partial_ptr, y_ptr, counter_ptr, tile, offsets, mask, slice_size, split,
                 splits):  # fmt: skip
    """Store one slice's partial sums of an output tile; the tile's last slice to arrive adds
    every slice's in slice order, writes `y` and resets the tile's counter."""
    tl.store(partial_ptr + split * slice_size + offsets, acc, mask=mask)
    tl.debug_barrier()  # every thread's partials stored before the count says so
    arrived = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == splits - 1:  # every partial is in
        total = tl.zeros_like(acc)
        for s in range(0, splits):
            total += tl.load(partial_ptr + s * slice_size + offsets, mask=mask, other=0.0,
                             cache_modifier=".cg")  # fmt: skip
        tl.store(y_ptr + offsets, total.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _dequantised(packed, qzeros_ptr, scales_ptr, k0, offs_k, mask_k, words, mask_w, offs_n,
                 mask_n, group_size, stride_zg, stride_sg, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, ONE_GROUP: tl.constexpr):  # fmt: skip
    """The `[BLOCK_K, BLOCK_N]` float32 weights of packed words `[BLOCK_K, BLOCK_N / 8]`, each
    word's eight nibbles unpacked in registers; a step within one group (`ONE_GROUP`) loads
    its zero points and scales once, not once a row."""
    channel = tl.arange(0, 8)
    # channel c of each eight sits in nibble (c // 2) + 4 * (c % 2): AWQ order 0 2 4 6 1 3 5 7
    shifts = ((channel // 2) + (channel % 2) * 4) * 4
    q = tl.reshape((packed[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_K, BLOCK_N))
    if ONE_GROUP:
        group = k0 // group_size
        zeros = tl.load(qzeros_ptr + group * stride_zg + words, mask=mask_w, other=0)
        z = tl.reshape((zeros[:, None] >> shifts[None, :]) & 0xF, (1, BLOCK_N))
        scales = tl.load(scales_ptr + group * stride_sg + offs_n, mask=mask_n, other=0.0)[None, :]
    else:
        groups = offs_k // group_size
        zeros = tl.load(qzeros_ptr + groups[:, None] * stride_zg + words[None, :],
                        mask=mask_k[:, None] & mask_w[None, :], other=0)  # fmt: skip
        z = tl.reshape((zeros[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_K, BLOCK_N))
        scales = tl.load(scales_ptr + groups[:, None] * stride_sg + offs_n[None, :],
                         mask=mask_k[:, None] & mask_n[None, :], other=0.0)  # fmt: skip
    return (q - z).to(tl.float32) * scales.to(tl.float32)


@triton.jit(do_not_specialize=["M", "split_len", "splits"])  # one compile for every batch size
def _int4_matmul_kernel(
    x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, y_ptr, partial_ptr, counter_ptr,
    M, N, K, group_size, split_len, splits,
    stride_xm, stride_xk, stride_wk, stride_zg, stride_sg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
    ONE_GROUP: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    words = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    mask_w = words < N // 8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = split * split_len
    for k0 in range(k_start, tl.minimum(k_start + split_len, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        packed = tl.load(qweight_ptr + offs_k[:, None] * stride_wk + words[None, :],
                         mask=mask_k[:, None] & mask_w[None, :], other=0)  # fmt: skip
        w = _dequantised(packed, qzeros_ptr, scales_ptr, k0, offs_k, mask_k, words, mask_w,
                         offs_n, mask_n, group_size, stride_zg, stride_sg,
                         BLOCK_K, BLOCK_N, ONE_GROUP).to(x.dtype)  # fmt: skip
        acc += tl.dot(x, w, input_precision="ieee")
    offsets = offs_m[:, None] * N + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT:
        tile = pid_m * tl.num_programs(1) + pid_n
        _fold_slices(acc, partial_ptr, y_ptr, counter_ptr, tile, offsets, mask, M * N, split,
                     splits)  # fmt: skip
    else:
        tl.store(y_ptr + offsets, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "split_len", "splits"])
def _int4_gemv_kernel(
    x_ptr, qweight_ptr, qzeros_ptr, scales_ptr, partial_ptr, y_ptr, counter_ptr,
    M, N, K, group_size, split_len, splits,
    stride_xm, stride_wk, stride_zg, stride_sg,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    words = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    mask_w = words < N // 8
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = split * split_len
    for k0 in range(k_start, tl.minimum(k_start + split_len, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # fmt: skip
        packed = tl.load(qweight_ptr + offs_k[:, None] * stride_wk + words[None, :],
                         mask=mask_k[:, None] & mask_w[None, :], other=0)  # fmt: skip
        w = _dequantised(packed, qzeros_ptr, scales_ptr, k0, offs_k, mask_k, words, mask_w,
                         offs_n, mask_n, group_size, stride_zg, stride_sg,
                         BLOCK_K, BLOCK_N, ONE_GROUP).to(x.dtype).to(tl.float32)  # fmt: skip
        acc += tl.sum(x.to(tl.float32)[:, :, None] * w[None, :, :], axis=1)
    offsets = offs_m[:, None] * N + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    _fold_slices(acc, partial_ptr, y_ptr, counter_ptr, pid_n, offsets, mask, M * N, split, splits)


def int4_gemv_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    splits: int | None = None,
    tiles: Tiles = GEMV_TILES,
) -> torch.Tensor:
    """`x` `[M <= GEMV_ROWS, in]` times the int4 weight `[in, out]` -> `[M, out]` in `x`'s
    dtype, split `splits` ways along `in` (None: enough to fill the GPU), by `tiles`."""
    rows, in_features = x.shape
    out_features = scales.shape[1]
    y = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    x = x.contiguous()
    columns = triton.cdiv(out_features, tiles.block_n)
    split_len, splits = _slices(columns, in_features, tiles.block_k, splits, x.device)
    partial = torch.empty(splits, rows, out_features, dtype=torch.float32, device=x.device)
    _int4_gemv_kernel[(columns, splits)](
        x, qweight, qzeros, scales, partial, y, _counters(x.device, columns),
        rows, out_features, in_features, group_size, split_len, splits,
        x.stride(0), qweight.stride(0), qzeros.stride(0), scales.stride(0),
        BLOCK_M=max(1, triton.next_power_of_2(rows)), BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, ONE_GROUP=group_size % tiles.block_k == 0,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    return y


def int4_gemm_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    splits: int | None = None,
    tiles: Tiles = GEMM_TILES,
) -> torch.Tensor:
    """`x` `[M, in]` times the int4 weight `[in, out]` -> `[M, out]` in `x`'s dtype by `tiles`
    (and a row tile for the batch), split `splits` ways along `in` (None: as many as fill the
    GPU, one where the tiles do)."""
    rows, in_features = x.shape
    out_features = scales.shape[1]
    y = torch.empty(rows, out_features, dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    block_m = _block_m(rows)
    grid = (triton.cdiv(rows, block_m), triton.cdiv(out_features, tiles.block_n))
    count = grid[0] * grid[1]
    split_len, splits = _slices(count, in_features, tiles.block_k, splits, x.device)
    split = splits > 1
    partial = (
        torch.empty(splits, rows, out_features, dtype=torch.float32, device=x.device)
        if split
        else y  # not read: a launch in one slice writes `y` directly
    )
    _int4_matmul_kernel[(*grid, splits)](
        x, qweight, qzeros, scales, y, partial, _counters(x.device, count if split else 1),
        rows, out_features, in_features, group_size, split_len, splits,
        x.stride(0), x.stride(1), qweight.stride(0), qzeros.stride(0), scales.stride(0),
        BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SPLIT=split,
        ONE_GROUP=group_size % tiles.block_k == 0, num_warps=tiles.num_warps,
    )  # fmt: skip
    return y


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's arrival counters, one an output tile, zero between launches: made once
    (before any graph capture, by the eager forward that precedes it), grown on demand."""
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < tiles:
        counters = torch.zeros(max(tiles, COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[device] = counters
    return counters


def _slices(
    tiles: int, in_features: int, block_k: int, splits: int | None, device: torch.device
) -> tuple[int, int]:
    """(slice length, slices): `in_features` cut into `splits` slices of whole `block_k`
    steps, none empty; None: as many as give the GPU about `PROGRAMS_PER_SM` programs per
    multiprocessor beside its `tiles` output tiles."""
    steps = triton.cdiv(in_features, block_k)
    if splits is None:  # interpreted, as if on 4: the tests' small layers still split
        splits = triton.cdiv(PROGRAMS_PER_SM * multiprocessors(device, elsewhere=4), tiles)
    split_len = triton.cdiv(steps, max(1, min(splits, steps))) * block_k
    return split_len, triton.cdiv(in_features, split_len)


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
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """`x` `[M, in]` times the int4 weight `[in, out]` -> `[M, out]` in `x`'s dtype: the GEMV
    up to `GEMV_ROWS` rows, the tiled GEMM beyond, by `tiles` (None: the product's own)."""
    args = (x, qweight, qzeros, scales, group_size)
    if 0 < x.shape[0] <= GEMV_ROWS:
        return int4_gemv_triton(*args, tiles=tiles or GEMV_TILES)
    return int4_gemm_triton(*args, tiles=tiles or GEMM_TILES)
