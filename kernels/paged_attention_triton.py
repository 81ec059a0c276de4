"""Triton kernels for attention over the KV cache (paged or contiguous), for CUDA.

Decode (one new token per sequence) is split-K: each program takes one (sequence, KV head,
split) and runs an online softmax over a chunk of the context, with the query heads that
share the KV head as one `[group, D]` tile, so each key and value is loaded once per group.
A second kernel merges the splits of each (sequence, query head) by their log-sum-exp.
Extend (several new tokens per sequence, prefill included) is a flash-attention loop: each
program takes a tile of one sequence's new tokens for one query head and reads the cached
prefix and the new tokens back from the cache, causally masked.

Positions map to cache slots through the block table (`slot = table[p // bs] * bs + p % bs`)
or, for contiguous KV, from the slab start (`slot = start + p`). The PyTorch references in
`paged_attention_ref.py` have the same signatures; on a CPU the kernels run only under
`TRITON_INTERPRET=1` (set before triton is imported), which is how the tests run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from servelab.base.errors import ConfigError
from servelab.kernels.capabilities import multiprocessors

MAX_SPLITS = 64
# Integers that change from call to call with the batch (the split length, the block table's
# row stride, the partials' strides that follow the number of splits): Triton would
# specialise each kernel on whether such a value is 1 or a multiple of 16 and compile it again
# inside a measured run; these are passed as plain integers instead.
PER_CALL_SPLIT = ["split_len", "stride_bt", "stride_mb", "stride_lb"]
PER_CALL_MERGE = ["split_len", "stride_mb", "stride_lb"]
PER_CALL_EXTEND = ["stride_bt"]


@triton.jit
def _slots(
    kv_index_ptr,
    b,
    stride_bt,
    pos,
    mask,
    PAGED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Flat cache slots (int64) of positions `pos` of sequence `b`."""
    if PAGED:
        block = tl.load(kv_index_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=mask, other=0)
        slots = block.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    else:
        slots = tl.load(kv_index_ptr + b).to(tl.int64) + pos
    return slots


@triton.jit(do_not_specialize=PER_CALL_SPLIT)
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    kv_index_ptr,
    seq_lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    scale,
    split_len,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_bt,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * split_len
    if start < seq_len:
        end = tl.minimum(start + split_len, seq_len)
        g = tl.arange(0, GROUP_P)
        d = tl.arange(0, D_P)
        g_mask = g < GROUP
        d_mask = d < HEAD_DIM
        heads = kvh * GROUP + g
        q = tl.load(
            q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_P], tl.float32)
        acc = tl.zeros([GROUP_P, D_P], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            p_mask = pos < end
            slots = _slots(kv_index_ptr, b, stride_bt, pos, p_mask, PAGED, BLOCK_SIZE)
            kv_mask = p_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            s = tl.where(p_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(
                v_ptr + slots[:, None] * stride_vs + kvh * stride_vh + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        mid = mid_o_ptr + b * stride_mb + heads[:, None] * stride_mh + split * stride_ms
        tl.store(mid + d[None, :], acc / l_i[:, None], mask=g_mask[:, None] & d_mask[None, :])
        lse = mid_lse_ptr + b * stride_lb + heads * stride_lh + split
        tl.store(lse, m_i + tl.log(l_i), mask=g_mask)


@triton.jit(do_not_specialize=PER_CALL_MERGE)
def _decode_merge_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    split_len,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    D_P: tl.constexpr,
    SPLITS_P: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    num_splits = tl.cdiv(seq_len, split_len)
    s = tl.arange(0, SPLITS_P)
    d = tl.arange(0, D_P)
    s_mask = s < num_splits
    d_mask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + b * stride_lb + h * stride_lh + s, mask=s_mask, other=-float("inf"))
    weight = tl.exp(lse - tl.max(lse, 0))
    mid = mid_o_ptr + b * stride_mb + h * stride_mh + s[:, None] * stride_ms + d[None, :]
    parts = tl.load(mid, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(weight[:, None] * parts, 0) / tl.sum(weight, 0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask
    )


@triton.jit(do_not_specialize=PER_CALL_EXTEND)
def _extend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    kv_index_ptr,
    seq_lens_ptr,
    query_start_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_P: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
):
    tile = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    if tile * BLOCK_M < q_len:
        seq_len = tl.load(seq_lens_ptr + b)
        prefix = seq_len - q_len
        kvh = h // GROUP
        m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, D_P)
        m_mask = m < q_len
        d_mask = d < HEAD_DIM
        q_pos = prefix + m
        rows = (q_start + m).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * stride_qt + h * stride_qh + d[None, :],
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_P], tl.float32)
        end = tl.minimum(seq_len, prefix + (tile + 1) * BLOCK_M)
        for n0 in range(0, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            p_mask = pos < end
            slots = _slots(kv_index_ptr, b, stride_bt, pos, p_mask, PAGED, BLOCK_SIZE)
            kv_mask = p_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            s = tl.where(p_mask[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            v = tl.load(
                v_ptr + slots[:, None] * stride_vs + kvh * stride_vh + d[None, :],
                mask=kv_mask,
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            o_ptr + rows[:, None] * stride_ot + h * stride_oh + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


@dataclass(frozen=True)
class DecodeLaunch:
    """Tile and split sizes of one decode launch: `num_splits` chunks of `split_len` positions."""

    block_n: int
    num_splits: int
    split_len: int


def decode_launch(
    batch: int, kv_heads: int, max_len: int, head_dim: int, device: torch.device
) -> DecodeLaunch:
    """Enough (sequence, KV head, split) programs to fill the device about twice over."""
    block_n = 64 if head_dim <= 64 else 32
    tiles = triton.cdiv(max(max_len, 1), block_n)
    programs = 2 * multiprocessors(device, elsewhere=1)
    want = min(triton.cdiv(programs, batch * kv_heads), tiles, MAX_SPLITS)
    return make_launch(block_n, max_len, max(want, 1))


def make_launch(block_n: int, max_len: int, num_splits: int) -> DecodeLaunch:
    """`num_splits` chunks (at most), each a whole number of `block_n` tiles, covering `max_len`."""
    tiles = triton.cdiv(max(max_len, 1), block_n)
    split_len = triton.cdiv(tiles, max(1, min(num_splits, tiles))) * block_n
    return DecodeLaunch(block_n, triton.cdiv(max(max_len, 1), split_len), split_len)


def paged_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor:
    """Same contract as `paged_decode_ref`; `launch` overrides the tile and split heuristic."""
    return _decode(q, k_cache, v_cache, block_tables, True, seq_lens, scale, launch)


def contiguous_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slab_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    launch: DecodeLaunch | None = None,
) -> torch.Tensor:
    """Same contract as `contiguous_decode_ref`; `launch` as in `paged_decode_triton`."""
    return _decode(q, k_cache, v_cache, slab_starts, False, seq_lens, scale, launch)


def paged_extend_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as `paged_extend_ref`."""
    return _extend(q, k_cache, v_cache, block_tables, True, seq_lens, query_start_loc, scale)


def contiguous_extend_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slab_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as `contiguous_extend_ref`."""
    return _extend(q, k_cache, v_cache, slab_starts, False, seq_lens, query_start_loc, scale)


def decode_with_launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_index: torch.Tensor,
    paged: bool,
    seq_lens: torch.Tensor,
    scale: float,
    launch: DecodeLaunch,
) -> torch.Tensor:
    """Decode with tensors already on `q`'s device and a precomputed launch (no host sync)."""
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    splits = launch.num_splits
    mid_o = torch.empty(batch, q_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(batch, q_heads, splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    group = q_heads // kv_heads
    d_p = _dot_width(head_dim)
    _decode_split_kernel[(batch, kv_heads, launch.num_splits)](
        q,
        k_cache,
        v_cache,
        kv_index,
        seq_lens,
        mid_o,
        mid_lse,
        scale,
        launch.split_len,
        q.stride(0),
        q.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(1),
        v_cache.stride(2),
        kv_index.stride(0),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        GROUP=group,
        GROUP_P=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        D_P=d_p,
        BLOCK_N=launch.block_n,
        BLOCK_SIZE=k_cache.shape[1],
        PAGED=paged,
        num_warps=4,
    )
    _decode_merge_kernel[(batch, q_heads)](
        mid_o,
        mid_lse,
        seq_lens,
        out,
        launch.split_len,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        D_P=d_p,
        SPLITS_P=triton.next_power_of_2(launch.num_splits),
        num_warps=4,
    )
    return out


def extend_on_device(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_index: torch.Tensor,
    paged: bool,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Extend with tensors already on `q`'s device and the longest query run known (no sync)."""
    tokens, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    block_m = 64 if head_dim <= 64 else 32
    grid = (triton.cdiv(max(max_query_len, 1), block_m), q_heads, seq_lens.shape[0])
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        kv_index,
        seq_lens,
        query_start_loc,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(1),
        v_cache.stride(2),
        out.stride(0),
        out.stride(1),
        kv_index.stride(0),
        GROUP=q_heads // kv_heads,
        HEAD_DIM=head_dim,
        D_P=_dot_width(head_dim),
        BLOCK_M=block_m,
        BLOCK_N=64 if head_dim <= 64 else 32,
        BLOCK_SIZE=k_cache.shape[1],
        PAGED=paged,
        num_warps=4,
    )
    return out


def check_triton_usable(device: torch.device, dtype: torch.dtype) -> None:
    """Raise a one-line error unless the kernels can run on `device` (CUDA, or the interpreter)."""
    if device.type == "cuda":
        return
    if not interpreted():
        raise ConfigError(
            "attention.impl",
            f"triton kernels need a CUDA device (got {device.type}); use impl=torch, or set "
            "TRITON_INTERPRET=1 before triton is imported to run them in the interpreter",
        )
    if dtype == torch.bfloat16:
        raise ConfigError(
            "attention.impl",
            "the Triton interpreter computes bfloat16 wrongly; use float32 or float16 on the "
            "CPU, or a CUDA device",
        )


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_index: torch.Tensor,
    paged: bool,
    seq_lens: torch.Tensor,
    scale: float,
    launch: DecodeLaunch | None,
) -> torch.Tensor:
    _check_inputs(q, k_cache, v_cache)
    if q.shape[0] != seq_lens.shape[0]:
        raise ConfigError(
            "q",
            f"decode needs one query row per sequence: got {q.shape[0]} rows for "
            f"{seq_lens.shape[0]} sequences; use the extend kernel for several new tokens",
        )
    max_len = int(seq_lens.max())
    if launch is None:
        launch = decode_launch(q.shape[0], k_cache.shape[2], max_len, q.shape[2], q.device)
    if launch.split_len % launch.block_n or launch.num_splits * launch.split_len < max_len:
        raise ConfigError(
            "launch",
            f"{launch} must cover {max_len} positions in whole tiles of block_n; "
            "build it with decode_launch or make_launch",
        )
    device = q.device
    return decode_with_launch(
        q,
        k_cache,
        v_cache,
        _index_on(kv_index, paged, device),
        paged,
        seq_lens.to(device, torch.int32),
        scale,
        launch,
    )


def _extend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_index: torch.Tensor,
    paged: bool,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    _check_inputs(q, k_cache, v_cache)
    starts = query_start_loc.to("cpu")
    if starts.shape[0] != seq_lens.shape[0] + 1 or int(starts[-1]) != q.shape[0]:
        raise ConfigError(
            "query_start_loc",
            f"must be [B + 1] offsets ending at T = {q.shape[0]} for "
            f"B = {seq_lens.shape[0]} sequences; got {starts.tolist()}",
        )
    device = q.device
    return extend_on_device(
        q,
        k_cache,
        v_cache,
        _index_on(kv_index, paged, device),
        paged,
        seq_lens.to(device, torch.int32),
        query_start_loc.to(device, torch.int32),
        scale,
        int((starts[1:] - starts[:-1]).max()),
    )


def _index_on(kv_index: torch.Tensor, paged: bool, device: torch.device) -> torch.Tensor:
    return kv_index.to(device, torch.int32 if paged else torch.int64)


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    check_triton_usable(q.device, q.dtype)
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ConfigError(
            "k_cache",
            f"caches must both be [num_blocks, block_size, Hkv, D]; got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}",
        )
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ConfigError(
            "q",
            f"must be [T, Hq, D] with Hq a multiple of Hkv = {k_cache.shape[2]} and "
            f"D = {k_cache.shape[3]}; got {tuple(q.shape)}",
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1 or t.device != q.device:
            raise ConfigError(name, "must have a contiguous last dimension, on q's device")
    if k_cache.stride(0) != k_cache.shape[1] * k_cache.stride(1):
        raise ConfigError("k_cache", "blocks must be contiguous (a flat slot view must exist)")
    if v_cache.stride(0) != v_cache.shape[1] * v_cache.stride(1):
        raise ConfigError("v_cache", "blocks must be contiguous (a flat slot view must exist)")


def interpreted() -> bool:
    """Whether the kernels were built for the Triton interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_extend_kernel, triton.runtime.JITFunction)


def _dot_width(head_dim: int) -> int:
    """Head dim padded to a power of two of at least 16, the smallest `tl.dot` accepts."""
    return max(16, triton.next_power_of_2(head_dim))
