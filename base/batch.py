"""The one explicit description of a model step, shared by the engine, the model and attention.

Every engine step packs the new tokens of all scheduled sequences into one ragged batch:
no padding, one row per new token. `ForwardBatch` says which tokens those are, where each
one sits in its sequence, where its key/value go in the KV cache, and how attention must
read the cache back. The model knows nothing about scheduling; it only reads this.

KV cache layout (both KV strategies): per layer, `k` and `v` are tensors of shape
`[num_blocks, block_size, num_kv_heads, head_dim]`, viewed flat as
`[num_slots, num_kv_heads, head_dim]` with `slot = block * block_size + offset`.
Contiguous KV gives each request one run of consecutive slots (`slab_starts`); paged KV
maps position `p` of sequence `b` to `block_tables[b, p // block_size] * block_size +
p % block_size`. New tokens' K/V are written at `slot_mapping` before attention reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class ForwardBatch:
    """A packed ragged batch: `B` sequences contributing `T` new tokens in total.

    Sequence `b` owns rows `query_start_loc[b] : query_start_loc[b + 1]`; its new tokens
    are the last `query_lens[b]` positions of a context of `seq_lens[b]` tokens, so the
    query at row offset `i` sits at position `seq_lens[b] - query_lens[b] + i` and attends
    causally to positions `0 ..` that position.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [B + 1] int32 (CPU)
    seq_lens: torch.Tensor  # [B] int32 (CPU), cached + new tokens after this step
    query_lens: list[int]  # [B] new tokens per sequence (Python ints, for per-sequence loops)
    slot_mapping: torch.Tensor  # [T] int64, flat KV slot for each new token
    logits_indices: torch.Tensor  # [S] int64, rows whose next-token logits are needed
    slab_starts: torch.Tensor | None = None  # [B] int64, contiguous KV: first slot of each slab
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, paged KV
    block_size: int = 1
    # seq_lens and query_start_loc on the model's device too (set by `to`), for the kernels
    device_lens: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def single(tokens: torch.Tensor, logits_rows: torch.Tensor | None = None) -> ForwardBatch:
        """One fresh sequence held contiguously from slot 0 (perplexity, reference checks);
        logits for `logits_rows`, by default the last token only."""
        count = int(tokens.shape[0])
        return ForwardBatch(
            input_ids=tokens,
            positions=torch.arange(count),
            query_start_loc=torch.tensor([0, count], dtype=torch.int32),
            seq_lens=torch.tensor([count], dtype=torch.int32),
            query_lens=[count],
            slot_mapping=torch.arange(count),
            logits_indices=torch.tensor([count - 1]) if logits_rows is None else logits_rows,
            slab_starts=torch.zeros(1, dtype=torch.int64),
        )

    @property
    def host_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What stays on the host however the batch is placed: the lengths the host plans
        with (the kernels read `device_lens`)."""
        return self.query_start_loc, self.seq_lens

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens)

    def to(self, device: torch.device) -> ForwardBatch:
        """The tensors the model and the kernels read, on `device` in one host-to-device copy
        (`moved`); host-side lists and lengths stay on the host."""
        ids, positions, slots, logits, starts, tables, lens, query_starts = moved(
            [self.input_ids, self.positions, self.slot_mapping, self.logits_indices,
             self.slab_starts, self.block_tables, self.seq_lens, self.query_start_loc],
            device,
        )  # fmt: skip
        assert lens is not None and query_starts is not None
        return ForwardBatch(
            input_ids=ids,
            positions=positions,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            query_lens=self.query_lens,
            slot_mapping=slots,
            logits_indices=logits,
            slab_starts=starts,
            block_tables=tables,
            block_size=self.block_size,
            device_lens=(lens, query_starts),
        )


def moved(tensors: list[torch.Tensor | None], device: torch.device) -> list[torch.Tensor | None]:
    """The tensors on `device`, each its own dtype and shape, in one copy: their bytes packed
    into one host buffer (the widest elements first, so that each lands aligned), moved at
    once, and viewed back. A step's metadata moved tensor by tensor took a copy each."""
    present = sorted(
        ((i, t) for i, t in enumerate(tensors) if t is not None),
        key=lambda pair: -pair[1].element_size(),
    )
    out = list(tensors)
    if not present:
        return out
    buffer = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in present])
    buffer = buffer.to(device, non_blocking=True)
    views = byte_views(buffer, [(tuple(t.shape), t.dtype) for _, t in present])
    for (i, _), view in zip(present, views, strict=True):
        out[i] = view
    return out


Layout = list[tuple[tuple[int, ...], torch.dtype]]  # (shape, dtype) of each tensor, in order


def layout_bytes(layout: Layout) -> int:
    """The bytes the tensors of `layout` take, one after the other."""
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in layout)


def byte_views(buffer: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Views of consecutive runs of a byte buffer as the tensors of `layout` (each lands
    aligned where the widest elements come first)."""
    views, offset = [], 0
    for shape, dtype in layout:
        size = math.prod(shape) * dtype.itemsize
        views.append(buffer[offset : offset + size].view(dtype).view(shape))
        offset += size
    return views


class AttentionFn(Protocol):
    """What a layer needs from attention: write this step's K/V, attend over the cache."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: ForwardBatch,
        scale: float,
    ) -> torch.Tensor: ...
