"""PyTorch attention over the KV cache, paged or contiguous: the reference and the CPU path.

These functions are what the Triton kernels are checked against, and also what the engine
runs wherever the kernels do not (the CPU), so they are written for speed on a CPU. Queries
read their context back from the cache (the new tokens' keys and values must already be
there). Any group size `Hq % Hkv == 0` works without repeating K/V. What runs, as measured
on the 2-core development machine (timings in the kernels' issue note):

- single-token (decode) sequences, sorted by length, in chunks through one padded gather:
  float32 paged KV in chunks of 16 through SDPA (the CPU flash kernel); bfloat16/float16
  in chunks of 8 through two batched GEMMs against a block-diagonal query matrix (SDPA's
  CPU kernel is several times slower in bfloat16);
- float32 contiguous KV: every sequence on its own over a view of its slab (no gather);
- multi-token sequences (prefill, extend) one by one over their context (a slab view, or
  their gathered blocks): explicit scores and softmax while the score matrix is small,
  SDPA above that.

Shapes: caches `[num_blocks, block_size, Hkv, D]`; block tables `[B, max_blocks]` int32;
`seq_lens` `[B]` int32 (context length including the new tokens); `query_start_loc`
`[B + 1]` int32; slab starts `[B]` int64 (first slot of each sequence's contiguous slab).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from servelab.base.errors import ConfigError
from servelab.kernels.attention_plan import AttentionPlan, DecodeChunk, SeqSpan, build_plan

# Above this many scores (rows x context x heads) a multi-token sequence goes through SDPA,
# which never holds the whole score matrix.
DENSE_SCORES_LIMIT = 1 << 22


def paged_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One new token per sequence (`q` `[B, Hq, D]`) over its paged context -> `[B, Hq, D]`."""
    starts = _decode_starts(q, seq_lens)
    plan = plan_for(q, k_cache, seq_lens, starts, block_tables, None)
    return run_plan(plan, q, k_cache, v_cache, scale)


def paged_extend_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """New tokens (`q` `[T, Hq, D]`, ragged) attend causally to cached prefix and themselves."""
    _check_ragged(q, seq_lens, query_start_loc)
    plan = plan_for(q, k_cache, seq_lens, query_start_loc, block_tables, None)
    return run_plan(plan, q, k_cache, v_cache, scale)


def contiguous_decode_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slab_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`paged_decode_ref` for contiguous KV: sequence b's context is slots `slab_starts[b] ..`."""
    starts = _decode_starts(q, seq_lens)
    plan = plan_for(q, k_cache, seq_lens, starts, None, slab_starts)
    return run_plan(plan, q, k_cache, v_cache, scale)


def contiguous_extend_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slab_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """`paged_extend_ref` for contiguous KV."""
    _check_ragged(q, seq_lens, query_start_loc)
    plan = plan_for(q, k_cache, seq_lens, query_start_loc, None, slab_starts)
    return run_plan(plan, q, k_cache, v_cache, scale)


def decode_chunk_size(dtype: torch.dtype, paged: bool) -> int | None:
    """Sequences per decode chunk, None for none: what measured fastest in each case."""
    if dtype != torch.float32:
        return 8
    return 16 if paged else None


def plan_for(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_tables: torch.Tensor | None,
    slab_starts: torch.Tensor | None,
) -> AttentionPlan:
    """The plan `run_plan` needs, sized for `q`'s dtype and device."""
    return build_plan(
        seq_lens,
        query_start_loc,
        block_tables,
        slab_starts,
        k_cache.shape[1],
        q.device,
        decode_chunk_size(q.dtype, block_tables is not None),
    )


def run_plan(
    plan: AttentionPlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention for every query row of a planned batch; returns `[T, Hq, D]` in `q`'s dtype."""
    out = torch.empty_like(q)
    k_flat = k_cache.view(-1, *k_cache.shape[2:])
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    attend = _attend_chunk_sdpa if q.dtype == torch.float32 else _attend_chunk_gemm
    for chunk in plan.decode_chunks:
        k, v = _gather_chunk(chunk, k_flat, v_flat)
        out[chunk.rows] = attend(q[chunk.rows], k, v, chunk.mask, scale)
    for seq in plan.seqs:
        k, v = _context(seq, plan.paged, k_cache, v_cache, k_flat, v_flat)
        rows = slice(seq.first_row, seq.first_row + seq.num_rows)
        out[rows] = _attend_seq(q[rows], k, v, seq.mask, scale)
    return out


def _gather_chunk(
    chunk: DecodeChunk, k_flat: torch.Tensor, v_flat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded `[C, Lp, Hkv, D]` keys and values of a decode chunk."""
    shape = (*chunk.slots.shape, *k_flat.shape[1:])
    index = chunk.slots.flatten()
    return k_flat.index_select(0, index).view(shape), v_flat.index_select(0, index).view(shape)


def _context(
    seq: SeqSpan,
    paged: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[seq_len, Hkv, D]` keys and values of one sequence: a view (slab) or a block gather."""
    if not paged:
        end = seq.slab_start + seq.seq_len
        return k_flat[seq.slab_start : end], v_flat[seq.slab_start : end]
    k = k_cache.index_select(0, seq.blocks).flatten(0, 1)[: seq.seq_len]
    v = v_cache.index_select(0, seq.blocks).flatten(0, 1)[: seq.seq_len]
    return k, v


def _attend_chunk_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """`q` `[C, Hq, D]` (one token each) over padded `k`, `v` `[C, Lp, Hkv, D]` under `mask`."""
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)


def _attend_chunk_gemm(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """`_attend_chunk_sdpa` as two contiguous batched GEMMs over all `Hkv * D` columns.

    The queries form a block-diagonal `[Hkv * D, Hq]` matrix (head h's query sits in the rows
    of its KV head), so one `[Lp, Hkv * D] x [Hkv * D, Hq]` product gives every head's scores;
    the value product keeps each head's own diagonal block. It spends `Hkv` times the needed
    multiply-adds but streams K and V once with no strided copies, which is what pays here.
    """
    c, lp, hkv, d = k.shape
    hq = q.shape[1]
    group = hq // hkv
    qbd = q.new_zeros(c, hkv, d, hkv, group)
    qbd.diagonal(dim1=1, dim2=3).copy_((q * scale).view(c, hkv, group, d).permute(0, 3, 2, 1))
    scores = torch.bmm(k.reshape(c, lp, hkv * d), qbd.view(c, hkv * d, hq)).float()
    scores.masked_fill_(~mask[:, :, None], float("-inf"))
    probs = scores.softmax(1).to(q.dtype)
    out = torch.bmm(probs.transpose(1, 2), v.reshape(c, lp, hkv * d))
    out = out.view(c, hkv, group, hkv, d).diagonal(dim1=1, dim2=3)
    return out.permute(0, 3, 1, 2).reshape(c, hq, d)


def _attend_seq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """`q` `[n, Hq, D]`, the last `n` positions of a context `k`, `v` `[L, Hkv, D]`, causally
    (`mask` `[n, L]`, or None for a single row, which sees the whole context)."""
    n, hq, d = q.shape
    length, hkv = k.shape[0], k.shape[1]
    if n * length * hq > DENSE_SCORES_LIMIT:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=None if mask is None or n == length else mask,
            is_causal=mask is not None and n == length,
            scale=scale,
            enable_gqa=True,
        )
        return out.transpose(0, 1)
    group = hq // hkv
    grouped = (q * scale).view(n, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * n, d)
    scores = torch.matmul(grouped, k.permute(1, 2, 0)).view(hkv, group, n, length).float()
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    probs = scores.softmax(-1).to(q.dtype).view(hkv, group * n, length)
    out = torch.matmul(probs, v.transpose(0, 1)).view(hkv, group, n, d)
    return out.permute(2, 0, 1, 3).reshape(n, hq, d)


def _decode_starts(q: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    if q.dim() != 3 or q.shape[0] != seq_lens.shape[0]:
        raise ConfigError(
            "q",
            f"decode needs one query row per sequence: got {tuple(q.shape)} for "
            f"{seq_lens.shape[0]} sequences; use the extend path for several new tokens",
        )
    return torch.arange(q.shape[0] + 1, dtype=torch.int32)


def _check_ragged(q: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor) -> None:
    if query_start_loc.shape[0] != seq_lens.shape[0] + 1 or int(query_start_loc[-1]) != q.shape[0]:
        raise ConfigError(
            "query_start_loc",
            f"must be [B + 1] offsets ending at T = {q.shape[0]} for "
            f"B = {seq_lens.shape[0]} sequences; got {query_start_loc.tolist()}",
        )
