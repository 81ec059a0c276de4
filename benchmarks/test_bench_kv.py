"""Paged KV bookkeeping: block allocation and free, a request's blocks through the manager,
and prefix-cache lookups of a cached 1,024-token prefix."""

from __future__ import annotations

import torch

from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.request import Request, SamplingParams
from servelab.strategies.kv.block_pool import BlockPool
from servelab.strategies.kv.paged import PagedConfig, PagedKVManager
from servelab.strategies.kv.prefix_cache import CachedBlock, PrefixCache

BLOCK = 16
LAYOUT = KVLayout(num_layers=1, stored_kv_heads=1, head_dim=1, dtype=torch.float32)


def test_block_pool_allocate_and_free_1024(benchmark) -> None:
    pool = BlockPool(4096, on_evict=lambda block: None)
    benchmark.group = "paged KV blocks"

    def allocate_and_free() -> int:
        blocks = [pool.allocate() for _ in range(1024)]
        for block in reversed(blocks):
            pool.release(block, cached=False)
        return pool.num_free

    assert benchmark(allocate_and_free) == 4096


def test_paged_manager_request_of_512_tokens(benchmark) -> None:
    """Admit a request, grow it to 512 tokens (32 blocks), free it."""
    cache = allocate_kv_cache(
        LAYOUT, 4096 * BLOCK * LAYOUT.bytes_per_token, BLOCK, torch.device("cpu")
    )
    manager = PagedKVManager(PagedConfig(BLOCK, False, "recompute"), cache)
    benchmark.group = "paged KV blocks"

    def lifetime() -> int:
        request = Request("r", list(range(512)), SamplingParams(max_tokens=1))
        manager.admit(request)
        manager.grow(request, 512)
        held = len(manager.block_ids(request))
        manager.free(request)
        return held

    assert benchmark(lifetime) == 32


def _cached_chain(cache: PrefixCache, tokens: list[int]) -> None:
    parent: CachedBlock | None = None
    for index in range(len(tokens) // BLOCK):
        chunk = tuple(tokens[index * BLOCK : (index + 1) * BLOCK])
        parent = cache.register(parent, chunk, block_id=index)


def test_prefix_lookup_hit_1024_tokens(benchmark) -> None:
    cache = PrefixCache(BLOCK)
    tokens = list(range(1000, 2024))
    _cached_chain(cache, tokens)
    benchmark.group = "prefix lookup"
    hits = benchmark(cache.lookup, tokens + [5, 6, 7], 1024 // BLOCK)
    assert len(hits) == 64


def test_prefix_lookup_miss_after_256_tokens(benchmark) -> None:
    cache = PrefixCache(BLOCK)
    tokens = list(range(1000, 2024))
    _cached_chain(cache, tokens)
    other = tokens[:256] + [0] * 768
    benchmark.group = "prefix lookup"
    hits = benchmark(cache.lookup, other, 1024 // BLOCK)
    assert len(hits) == 16
