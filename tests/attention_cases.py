"""Random attention cases over a filled KV cache, and the naive dense attention they must match.

Tests and benchmarks need the same thing: a ragged batch of sequences whose contexts sit in
a KV cache (paged through a shuffled block table, or in contiguous slabs at scattered starts),
plus the ground truth computed from scratch from the contexts themselves, without the cache.
Every slot outside the contexts holds NaN, so any read of a wrong slot shows in the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.base.batch import ForwardBatch
from servelab.base.errors import ConfigError


@dataclass(frozen=True)
class CaseShape:
    """Head layout and cache geometry of a case."""

    q_heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    block_size: int = 16
    paged: bool = True


@dataclass(frozen=True)
class AttentionCase:
    """A ragged batch: sequence b has `seq_lens[b]` positions, of which the last
    `query_lens[b]` are new tokens (rows `query_start_loc[b] ..` of `q`, `k_new`, `v_new`)."""

    shape: CaseShape
    q: torch.Tensor  # [T, Hq, D]
    k_new: torch.Tensor  # [T, Hkv, D]
    v_new: torch.Tensor  # [T, Hkv, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    seq_lens: torch.Tensor  # [B] int32
    query_lens: list[int]
    query_start_loc: torch.Tensor  # [B + 1] int32
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor | None  # [B, max_blocks] int32, unused entries -1
    slab_starts: torch.Tensor | None  # [B] int64
    contexts_k: list[torch.Tensor]  # per sequence [L, Hkv, D], the truth
    contexts_v: list[torch.Tensor]

    @property
    def kv_index(self) -> torch.Tensor:
        """Block tables (paged) or slab starts (contiguous)."""
        return self.block_tables if self.shape.paged else self.slab_starts

    def forward_batch(self) -> ForwardBatch:
        """The batch description the engine would build for this case."""
        tokens = self.q.shape[0]
        ends = self.query_start_loc[1:].to(torch.int64)
        positions = torch.cat(
            [
                torch.arange(n - q, n)
                for n, q in zip(self.seq_lens.tolist(), self.query_lens, strict=True)
            ]
        )
        return ForwardBatch(
            input_ids=torch.zeros(tokens, dtype=torch.int64),
            positions=positions,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            query_lens=list(self.query_lens),
            slot_mapping=self.slot_mapping,
            logits_indices=ends - 1,
            slab_starts=self.slab_starts,
            block_tables=self.block_tables,
            block_size=self.shape.block_size,
        )


def make_case(
    seq_lens: list[int],
    query_lens: list[int],
    shape: CaseShape,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    new_in_cache: bool = True,
) -> AttentionCase:
    """Random contexts laid out in a NaN-filled cache; `new_in_cache=False` leaves the new
    tokens' slots NaN (for the entry point to write)."""
    if len(seq_lens) != len(query_lens) or any(
        not 1 <= q <= n for n, q in zip(seq_lens, query_lens, strict=False)
    ):
        raise ConfigError("query_lens", "need one per sequence, each in 1 .. its seq_len")
    gen = torch.Generator().manual_seed(seed)
    bs, hkv, d = shape.block_size, shape.kv_heads, shape.head_dim
    if shape.paged:
        tables, slots_each, num_blocks = _shuffled_blocks(seq_lens, bs, gen)
        starts = None
    else:
        starts, slots_each, num_blocks = _spread_slabs(seq_lens, bs, gen)
        tables = None

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).to(dtype)

    contexts_k = [rand(n, hkv, d) for n in seq_lens]
    contexts_v = [rand(n, hkv, d) for n in seq_lens]
    k_cache = torch.full((num_blocks, bs, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    k_flat, v_flat = k_cache.view(-1, hkv, d), v_cache.view(-1, hkv, d)
    new_slots, k_new, v_new = [], [], []
    for b, (n, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        written = n if new_in_cache else n - q
        k_flat[slots_each[b][:written]] = contexts_k[b][:written]
        v_flat[slots_each[b][:written]] = contexts_v[b][:written]
        new_slots.append(slots_each[b][n - q :])
        k_new.append(contexts_k[b][n - q :])
        v_new.append(contexts_v[b][n - q :])
    query_start_loc = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.tensor(query_lens).cumsum(0)
    dev = torch.device(device)
    return AttentionCase(
        shape=shape,
        q=rand(sum(query_lens), shape.q_heads, d).to(dev),
        k_new=torch.cat(k_new).to(dev),
        v_new=torch.cat(v_new).to(dev),
        k_cache=k_cache.to(dev),
        v_cache=v_cache.to(dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_lens=list(query_lens),
        query_start_loc=query_start_loc,
        slot_mapping=torch.cat(new_slots).to(dev),
        block_tables=None if tables is None else tables.to(dev),
        slab_starts=starts,
        contexts_k=contexts_k,
        contexts_v=contexts_v,
    )


def dense_attention(case: AttentionCase, scale: float) -> torch.Tensor:
    """Causal attention of every new token over its own context, in float64, without the cache."""
    group = case.shape.q_heads // case.shape.kv_heads
    q = case.q.detach().cpu().double()
    rows = []
    for b, (n, new) in enumerate(zip(case.seq_lens.tolist(), case.query_lens, strict=True)):
        k = case.contexts_k[b].double().repeat_interleave(group, dim=1)
        v = case.contexts_v[b].double().repeat_interleave(group, dim=1)
        first = int(case.query_start_loc[b])
        for i in range(new):
            visible = n - new + i + 1
            scores = torch.einsum("hd,lhd->hl", q[first + i], k[:visible]) * scale
            rows.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v[:visible]))
    return torch.stack(rows)


def _shuffled_blocks(
    seq_lens: list[int], block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Each sequence gets blocks drawn from a shuffled pool; table entries past its last are -1."""
    blocks_each = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_each) + 3
    pool = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(seq_lens), max(blocks_each) + 1), -1, dtype=torch.int32)
    slots = []
    used = 0
    for b, n in enumerate(seq_lens):
        mine = pool[used : used + blocks_each[b]]
        used += blocks_each[b]
        tables[b, : len(mine)] = mine.to(torch.int32)
        pos = torch.arange(n)
        slots.append(mine[pos // block_size] * block_size + pos % block_size)
    return tables, slots, num_blocks


def _spread_slabs(
    seq_lens: list[int], block_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Contiguous slabs in shuffled order with random gaps, so no slab starts at slot 0."""
    order = torch.randperm(len(seq_lens), generator=gen).tolist()
    starts = torch.zeros(len(seq_lens), dtype=torch.int64)
    cursor = 0
    for b in order:
        cursor += int(torch.randint(1, 2 * block_size, (1,), generator=gen))
        starts[b] = cursor
        cursor += seq_lens[b]
    num_blocks = -(-(cursor + 1) // block_size) + 1
    slots = [int(starts[b]) + torch.arange(n) for b, n in enumerate(seq_lens)]
    return starts, slots, num_blocks
