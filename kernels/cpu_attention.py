"""Attention over the KV cache on the CPU, fast: a compiled operator and torch's flash kernel.

Two paths, chosen per sequence once per batch (`plan_cpu`), every layer reusing the plan:

- Sequences with few new tokens (decode, speculative verification, short chunks) go through
  `cpu_paged_attention`, a C++ operator (`kernels/cpu/paged_attention.cpp`, built per ISA
  level by `kernels.cpu_build`): one call per layer for all of them, reading each
  sequence's keys and values once per KV head, straight from paged blocks or a slab.
- Sequences with many new tokens (prefill) go through a flash kernel, which never
  materialises the score matrix. In bfloat16 at the `avx512-bf16` level it is
  `flash_attention` (`kernels/cpu/flash_attention.cpp`, both products on vdpbf16ps, where
  it is faster than torch's kernel): one causal call over the cached prefix's keys and
  values (gathered) followed by the new ones. Elsewhere it is torch's CPU flash kernel: a
  fresh prompt as one causal call; a prompt whose prefix is cached (prefix hits, chunked
  prefill) as two calls, the new tokens over the prefix (no mask) and over themselves
  (causal), merged by their log-sum-exps.

`kernels.paged_attention_ref` is the reference both are tested against; where the operator
cannot be built (no compiler), `kernels.attention` falls back to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.base.batch import ForwardBatch
from servelab.kernels.cpu_build import cpu_ops

FLASH_ROWS = 16  # sequences with at least this many new tokens take the flash path
OWN_FLASH_HEAD_DIMS = (32, 64, 128)  # flash_attention's tiles


@dataclass(frozen=True)
class LongSeq:
    """A sequence with many new tokens: rows `first_row ..` end a context of `seq_len`."""

    first_row: int
    num_rows: int
    seq_len: int
    prefix_slots: torch.Tensor | None  # [seq_len - num_rows] int64 cache slots; None if fresh


@dataclass(frozen=True)
class CpuPlan:
    """One batch's split into the operator's sequences and the flash path's."""

    paged: bool
    short_rows: torch.Tensor | None  # [R] int64 query rows of the short sequences; None: all
    short_query_start_loc: torch.Tensor  # [S + 1] int32
    short_seq_lens: torch.Tensor  # [S] int32
    short_kv_index: torch.Tensor  # [S, max_blocks] int32 tables or [S] int64 slab starts
    long: list[LongSeq]


def plan_cpu(batch: ForwardBatch, block_size: int) -> CpuPlan:
    """Split the batch's sequences by their number of new tokens (Python work per sequence)."""
    paged = batch.block_tables is not None
    index = batch.block_tables if paged else batch.slab_starts
    starts = batch.query_start_loc.tolist()
    lens = batch.seq_lens.tolist()
    short, long = [], []
    for b, rows in enumerate(batch.query_lens):
        if rows >= FLASH_ROWS:
            long.append(_long_seq(b, starts[b], rows, lens[b], index, paged, block_size))
        elif rows:
            short.append(b)
    every = len(short) == len(batch.query_lens)
    picked = torch.tensor(short, dtype=torch.int64)
    counts = torch.tensor([batch.query_lens[b] for b in short], dtype=torch.int32)
    short_starts = torch.zeros(len(short) + 1, dtype=torch.int32)
    torch.cumsum(counts, 0, out=short_starts[1:])
    rows = None
    if not every and short:
        rows = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in short])
    return CpuPlan(
        paged=paged,
        short_rows=rows,
        short_query_start_loc=short_starts,
        short_seq_lens=batch.seq_lens.index_select(0, picked).to(torch.int32),
        short_kv_index=index.index_select(0, picked).contiguous(),
        long=long,
    )


def _long_seq(
    b: int, first_row: int, rows: int, seq_len: int, index: torch.Tensor, paged: bool, bs: int
) -> LongSeq:
    cached = seq_len - rows
    if cached == 0:
        return LongSeq(first_row, rows, seq_len, None)
    positions = torch.arange(cached, dtype=torch.int64)
    if paged:
        slots = index[b].to(torch.int64)[positions // bs] * bs + positions % bs
    else:
        slots = int(index[b]) + positions
    return LongSeq(first_row, rows, seq_len, slots)


def run_cpu(
    plan: CpuPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention for every query row (`q` `[T, Hq, D]`; `k`, `v` the step's new keys and values,
    already written to the caches); returns `[T, Hq, D]`."""
    out = torch.empty_like(q)
    ops = cpu_ops()
    if plan.short_seq_lens.numel():
        short_q = q if plan.short_rows is None else q.index_select(0, plan.short_rows)
        result = ops.cpu_paged_attention(
            short_q.contiguous(),
            k_cache,
            v_cache,
            plan.short_query_start_loc,
            plan.short_seq_lens,
            plan.short_kv_index,
            plan.paged,
            scale,
        )
        if plan.short_rows is None:
            out = result
        else:
            out.index_copy_(0, plan.short_rows, result)
    for seq in plan.long:
        rows = slice(seq.first_row, seq.first_row + seq.num_rows)
        out[rows] = flash_rows(q[rows], k[rows], v[rows], seq, k_cache, v_cache, scale)
    return out


def flash_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq: LongSeq,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One sequence's new rows over its cached prefix and themselves, by a flash kernel."""
    if seq.prefix_slots is not None:
        k_flat = k_cache.view(-1, *k_cache.shape[2:])
        v_flat = v_cache.view(-1, *v_cache.shape[2:])
        prefix_k = k_flat.index_select(0, seq.prefix_slots)
        prefix_v = v_flat.index_select(0, seq.prefix_slots)
    if own_flash_fits(q):
        if seq.prefix_slots is not None:
            k, v = torch.cat((prefix_k, k)), torch.cat((prefix_v, v))
        return cpu_ops().flash_attention(q, k, v, scale)
    group = q.shape[1] // k.shape[1]
    query = q.transpose(0, 1).unsqueeze(0)
    own, own_lse = _flash(query, k, v, group, True, scale)
    if seq.prefix_slots is None:
        return own
    before, before_lse = _flash(query, prefix_k, prefix_v, group, False, scale)
    return merge_by_lse(before, before_lse, own, own_lse)


def own_flash_fits(q: torch.Tensor) -> bool:
    """Whether the compiled `flash_attention` serves these queries: bfloat16, a head dim it
    tiles, and the `avx512-bf16` build (the only one that registers it)."""
    return q.dtype == torch.bfloat16 and q.shape[2] in OWN_FLASH_HEAD_DIMS and own_flash_built()


def own_flash_built() -> bool:
    """Whether the build dispatch uses has the compiled flash kernel."""
    ops = cpu_ops()
    return ops is not None and hasattr(ops, "flash_attention")


def _flash(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: int,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash attention of `query` `[1, Hq, n, D]` over `k`, `v` `[L, Hkv, D]`: the output as
    `[n, Hq, D]` and the log-sum-exp `[n, Hq]` (fp32)."""
    keys = k.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    values = v.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, keys, values, is_causal=causal, scale=scale
    )
    return out[0].transpose(0, 1), lse[0].transpose(0, 1)


def merge_by_lse(
    first: torch.Tensor, first_lse: torch.Tensor, second: torch.Tensor, second_lse: torch.Tensor
) -> torch.Tensor:
    """Softmax over the union of two disjoint key sets, from each set's output and LSE."""
    peak = torch.maximum(first_lse, second_lse)
    w1 = (first_lse - peak).exp().unsqueeze(-1)
    w2 = (second_lse - peak).exp().unsqueeze(-1)
    merged = (first.float() * w1 + second.float() * w2) / (w1 + w2)
    return merged.to(first.dtype)
