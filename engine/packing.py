"""Pack sequences' new tokens into one `ForwardBatch` over a KV manager's slots.

The engine packs each step of the target model this way, and a speculative draft model packs
its own steps the same way over its own KV manager: positions, slot mapping and the cache
layout are built with tensor operations, so the work per batch scales with the number of
sequences, not tokens.
"""

from __future__ import annotations

import torch

from servelab.base.batch import ForwardBatch
from servelab.engine.kv_manager import KVManager
from servelab.engine.request import Request


def pack(
    kv: KVManager,
    requests: list[Request],
    starts: list[int],
    counts: list[int],
    ids: list[int],
    logits_rows: list[int],
) -> ForwardBatch:
    """Sequence `i` feeds `counts[i]` tokens at positions `starts[i]` on (its slots already
    grown); `ids` holds every fed token in that order; logits come back for `logits_rows`."""
    fed = torch.tensor(counts, dtype=torch.int64)
    ends = torch.tensor(starts, dtype=torch.int64) + fed
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int64)
    torch.cumsum(fed, 0, out=query_start_loc[1:])
    row_seq = torch.repeat_interleave(torch.arange(len(requests)), fed)
    positions = torch.arange(len(ids)) - query_start_loc[row_seq] + (ends - fed)[row_seq]
    slot_mapping = torch.cat(
        [kv.slot_mapping(r, s, s + c) for r, s, c in zip(requests, starts, counts, strict=True)]
    )
    layout = kv.layout(requests)
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=positions,
        query_start_loc=query_start_loc.to(torch.int32),
        seq_lens=ends.to(torch.int32),
        query_lens=list(counts),
        slot_mapping=slot_mapping,
        logits_indices=torch.tensor(logits_rows, dtype=torch.int64),
        slab_starts=layout.get("slab_starts"),
        block_tables=layout.get("block_tables"),
        block_size=int(layout.get("block_size", 1)),
    )
