"""Triton kernels that fuse a decoder layer's small operators, one launch each, for CUDA.

A decoder layer run module by module launches some fifty operators (`benchmarks/
bench_launches.py`), most of them elementwise: RMSNorm in fp32 with its conversions, the
residual add, rotary embedding by `chunk` and `cat`, SiLU and the product. Each kernel here
does one of those groups in one pass, with the eager modules' arithmetic (fp32 inside, the
same roundings to the activation dtype at the same points):

- `add_rmsnorm`: `residual += x` (when a residual is given), then RMSNorm of the sum;
- `rotary_write_kv`: rotate the queries and keys of a fused QKV projection by each token's
  position (rotate-half, the tables in fp32 gathered in the kernel) and write the rotated keys
  and the values into one layer's cache at the batch's slots;
- `silu_mul`: `silu(gate) * up` of a fused gate-up projection.

The references are the eager modules (`models.model`); the tests compare them through
the interpreter (`TRITON_INTERPRET=1`, set before triton is imported).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * hidden + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(residual_ptr + row * hidden + cols, mask=mask, other=0.0)  # in dtype
        tl.store(residual_ptr + row * hidden + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / hidden
    normed = (x32 * tl.math.rsqrt(variance + eps)).to(x.dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * hidden + cols, normed * weight, mask=mask)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm of `x + residual` (of `x` alone when `residual` is None), the sum written back
    into `residual`; `x`, `residual` `[T, hidden]` contiguous."""
    tokens, hidden = x.shape
    out = torch.empty_like(x)
    if tokens:
        _add_rmsnorm_kernel[(tokens,)](
            x, x if residual is None else residual, weight, out, hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
        )  # fmt: skip
    return out


@triton.jit
def _rotary_write_kv_kernel(
    qkv_ptr, cos_ptr, sin_ptr, positions_ptr, slots_ptr, k_cache_ptr, v_cache_ptr, q_out_ptr,
    stride_qkv, stride_slot, num_heads, num_kv_heads,
    HALF: tl.constexpr, HALF_P: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    head = tl.program_id(1)  # query heads first, then KV heads
    half = tl.arange(0, HALF_P)
    mask = half < HALF
    position = tl.load(positions_ptr + token)
    row = qkv_ptr + token * stride_qkv
    dim = 2 * HALF
    if head < num_heads + num_kv_heads:  # a query or a key head: rotated
        first = tl.load(row + head * dim + half, mask=mask, other=0.0)
        second = tl.load(row + head * dim + HALF + half, mask=mask, other=0.0)
        cos = tl.load(cos_ptr + position * HALF + half, mask=mask, other=0.0).to(first.dtype)
        sin = tl.load(sin_ptr + position * HALF + half, mask=mask, other=0.0).to(first.dtype)
        a = (first * cos).to(first.dtype) - (second * sin).to(first.dtype)
        b = (second * cos).to(first.dtype) + (first * sin).to(first.dtype)
        keep = mask
        if head < num_heads:
            out = q_out_ptr + (token * num_heads + head) * dim
        else:
            slot = tl.load(slots_ptr + token).to(tl.int64)
            out = k_cache_ptr + slot * stride_slot + (head - num_heads) * dim
            keep = mask & (half * 0 + slot >= 0)  # a padded row's slot is negative: no write
        tl.store(out + half, a, mask=keep)
        tl.store(out + HALF + half, b, mask=keep)
    else:  # a value head: copied into the cache
        slot = tl.load(slots_ptr + token).to(tl.int64)
        kv_head = head - num_heads - num_kv_heads
        out = v_cache_ptr + slot * stride_slot + kv_head * dim
        for part in tl.static_range(2):
            value = tl.load(row + head * dim + part * HALF + half, mask=mask, other=0.0)
            tl.store(out + part * HALF + half, value, mask=mask & (half * 0 + slot >= 0))


def rotary_write_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
) -> torch.Tensor:
    """The rotated queries `[T, Hq, D]` of `qkv` `[T, (Hq + 2 Hkv) D]`; the rotated keys and
    the values written into `k_cache`, `v_cache` (`[blocks, block_size, Hkv, D]`) at
    `slot_mapping`, none for a negative slot (a padded row). `cos`, `sin` `[positions, D / 2]`
    fp32 tables."""
    tokens = qkv.shape[0]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if tokens:
        _rotary_write_kv_kernel[(tokens, num_heads + 2 * num_kv_heads)](
            qkv, cos, sin, positions, slot_mapping, k_cache, v_cache, q,
            qkv.stride(0), k_cache.stride(1), num_heads, num_kv_heads,
            HALF=head_dim // 2, HALF_P=triton.next_power_of_2(head_dim // 2),
        )  # fmt: skip
    return q


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    gate = tl.load(gate_up_ptr + row * 2 * inner + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * 2 * inner + inner + cols, mask=mask, other=0.0)
    gate32 = gate.to(tl.float32)
    silu = (gate32 / (1.0 + tl.exp(-gate32))).to(gate.dtype)
    tl.store(out_ptr + row * inner + cols, silu * up, mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` `[T, 2 inner]` (the gate's columns first)."""
    tokens, inner = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(tokens, inner, dtype=gate_up.dtype, device=gate_up.device)
    if tokens:
        block = min(1024, triton.next_power_of_2(inner))
        _silu_mul_kernel[(tokens, triton.cdiv(inner, block))](gate_up, out, inner, BLOCK=block)
    return out
