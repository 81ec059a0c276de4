"""Copies of whole KV blocks: to host memory and back (swap preemption), and block to block.

Swap preemption moves a request's computed blocks out of the device cache into host tensors
so the blocks can serve others, and copies them back into fresh blocks when the request
resumes, so nothing is recomputed. Copy-on-write duplicates one block in every layer before
a request writes into a block it shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.engine.kv_cache import KVCache

HOST = torch.device("cpu")


@dataclass
class SwappedKV:
    """A request's blocks in host memory, per layer `[num_blocks, block_size, heads, dim]`."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    num_blocks: int


def _index(blocks: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(blocks, dtype=torch.int64, device=device)


def swap_out(cache: KVCache, blocks: list[int]) -> SwappedKV:
    """Copy `blocks` (in this order) of every layer to host memory."""
    index = _index(blocks, cache.k[0].device)
    return SwappedKV(
        k=[layer.index_select(0, index).to(HOST) for layer in cache.k],
        v=[layer.index_select(0, index).to(HOST) for layer in cache.v],
        num_blocks=len(blocks),
    )


def swap_in(cache: KVCache, swapped: SwappedKV, blocks: list[int]) -> None:
    """Write the host copies back into `blocks`, one per swapped block, in order."""
    if len(blocks) != swapped.num_blocks:
        raise ValueError(f"{swapped.num_blocks} blocks were swapped out, {len(blocks)} given back")
    index = _index(blocks, cache.k[0].device)
    for layer, saved in zip(cache.k + cache.v, swapped.k + swapped.v, strict=True):
        layer.index_copy_(0, index, saved.to(layer.device))


def copy_block(cache: KVCache, src: int, dst: int) -> None:
    """Block `dst` becomes a copy of block `src` in every layer, keys and values."""
    for layer in cache.k + cache.v:
        layer[dst].copy_(layer[src])
