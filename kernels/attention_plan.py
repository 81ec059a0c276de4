"""Plan of one batch for the PyTorch attention path: which query rows read which cache slots.

The plan is built once per engine step from the batch description and reused by every layer,
so the per-layer work is only gathers and attention. Single-token (decode) sequences are
sorted by context length and grouped into chunks attended together through one padded
gather, or, without chunking, attended one by one like sequences with several new tokens
(prefill, extend), over their own context. Building the plan costs Python work per sequence
or chunk, never per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeChunk:
    """Single-token sequences attended together: row `rows[i]` reads its first `lens[i]` slots."""

    rows: torch.Tensor  # [C] int64 query rows, one per sequence
    slots: torch.Tensor  # [C, Lp] int64 flat cache slots of each context, padded
    mask: torch.Tensor  # [C, Lp] bool, True where the padded position is in the context


@dataclass(frozen=True)
class SeqSpan:
    """One sequence attended on its own: rows `first_row ..` attend causally to its context."""

    first_row: int
    num_rows: int
    seq_len: int
    blocks: torch.Tensor | None  # paged: [nb] int64 block ids covering the context
    slab_start: int  # contiguous: first slot of the slab
    mask: torch.Tensor | None  # [num_rows, seq_len] bool, row i may read position j; None: all


@dataclass(frozen=True)
class AttentionPlan:
    """Everything the PyTorch attention path needs for one batch, on the cache's device."""

    paged: bool
    decode_chunks: list[DecodeChunk]
    seqs: list[SeqSpan]


def build_plan(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_tables: torch.Tensor | None,
    slab_starts: torch.Tensor | None,
    block_size: int,
    device: torch.device,
    chunk: int | None,
) -> AttentionPlan:
    """Plan a batch whose cache lives on `device`, with decode chunks of up to `chunk`
    sequences (None: no chunks); exactly one of `block_tables` (paged) and `slab_starts`
    (contiguous) is set."""
    lens = seq_lens.to("cpu", torch.int64)
    starts = query_start_loc.to("cpu", torch.int64)
    query_lens = starts[1:] - starts[:-1]
    tables = None if block_tables is None else block_tables.to("cpu", torch.int64)
    slabs = None if slab_starts is None else slab_starts.to("cpu", torch.int64)

    chunked = query_lens == 1 if chunk else torch.zeros_like(query_lens, dtype=torch.bool)
    decode_seqs = torch.nonzero(chunked).flatten()
    decode_seqs = decode_seqs[torch.argsort(lens[decode_seqs], descending=True, stable=True)]
    chunks = [
        _decode_chunk(decode_seqs[i : i + chunk], lens, starts, tables, slabs, block_size, device)
        for i in range(0, len(decode_seqs), chunk or 1)
    ]
    seqs = [
        _seq_span(b, lens, starts, query_lens, tables, slabs, block_size, device)
        for b in torch.nonzero(~chunked & (query_lens > 0)).flatten().tolist()
    ]
    return AttentionPlan(tables is not None, chunks, seqs)


def _decode_chunk(
    seqs: torch.Tensor,
    lens: torch.Tensor,
    starts: torch.Tensor,
    tables: torch.Tensor | None,
    slabs: torch.Tensor | None,
    block_size: int,
    device: torch.device,
) -> DecodeChunk:
    """Slots `[C, Lp]` of a chunk's contexts; padding points at each sequence's first slot.

    Padding never reads a slot outside the contexts (which may hold stale or unwritten
    values, NaN included), so the masked positions contribute exact zeros.
    """
    chunk_lens = lens[seqs]
    longest = int(chunk_lens.max())
    pos = torch.arange(longest)
    if tables is not None:
        blocks = tables[seqs, : -(-longest // block_size)]
        slots = (blocks[:, :, None] * block_size + torch.arange(block_size)).flatten(1)
        slots = slots[:, :longest]
    else:
        slots = slabs[seqs, None] + pos
    valid = pos < chunk_lens[:, None]
    slots = torch.where(valid, slots, slots[:, :1])
    return DecodeChunk(rows=starts[seqs].to(device), slots=slots.to(device), mask=valid.to(device))


def _seq_span(
    b: int,
    lens: torch.Tensor,
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    tables: torch.Tensor | None,
    slabs: torch.Tensor | None,
    block_size: int,
    device: torch.device,
) -> SeqSpan:
    seq_len, num_rows = int(lens[b]), int(query_lens[b])
    mask = None
    if num_rows > 1:
        query_pos = torch.arange(seq_len - num_rows, seq_len)
        mask = (torch.arange(seq_len)[None, :] <= query_pos[:, None]).to(device)
    blocks = None if tables is None else tables[b, : -(-seq_len // block_size)].to(device)
    return SeqSpan(
        first_row=int(starts[b]),
        num_rows=num_rows,
        seq_len=seq_len,
        blocks=blocks,
        slab_start=0 if slabs is None else int(slabs[b]),
        mask=mask,
    )
