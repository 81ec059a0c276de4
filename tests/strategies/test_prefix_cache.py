"""Prefix cache: chained block hashes, whole-block matching, and the collision guard."""

from __future__ import annotations

import pytest

from servelab.strategies.kv import prefix_cache
from servelab.strategies.kv.prefix_cache import PrefixCache, block_hash

A, B, C, D = (1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12), (13, 14, 15, 16)


def test_hashes_chain_through_the_parent_block() -> None:
    cache = PrefixCache(4)
    first = cache.register(None, A, block_id=7)
    second = cache.register(first, B, block_id=3)
    assert first is not None and second is not None
    assert first.block_hash == block_hash(None, A)
    assert second.block_hash == block_hash(block_hash(None, A), B)
    assert second.block_hash != block_hash(None, B)  # same tokens, other prefix: other hash
    assert second.parent is first
    assert [e.block_id for e in cache.lookup(A + B + C, max_blocks=3)] == [7, 3]
    assert cache.lookup(C + B, max_blocks=2) == []  # B only matches after A
    assert [e.block_id for e in cache.lookup(A + C + B, max_blocks=3)] == [7]


def test_lookup_matches_whole_blocks_only_and_respects_the_limit() -> None:
    cache = PrefixCache(4)
    first = cache.register(None, A, block_id=0)
    cache.register(first, B, block_id=1)
    assert [e.block_id for e in cache.lookup(A + B[:3], max_blocks=5)] == [0]
    assert [e.block_id for e in cache.lookup(A + B, max_blocks=1)] == [0]
    assert cache.lookup(A + B, max_blocks=0) == []
    assert cache.lookup(A[:3], max_blocks=1) == []


def test_equal_content_keeps_its_first_block_and_eviction_forgets_it() -> None:
    cache = PrefixCache(4)
    first = cache.register(None, A, block_id=0)
    assert cache.register(None, A, block_id=5) is first
    assert cache.holds(0) and not cache.holds(5)
    second = cache.register(first, B, block_id=1)
    cache.evict(0)
    assert not cache.holds(0) and len(cache) == 1
    assert cache.lookup(A + B, max_blocks=2) == []
    again = cache.register(None, A, block_id=2)
    assert again is not None and again is not first
    # the orphaned child of the evicted entry is never reached through the new parent
    assert [e.block_id for e in cache.lookup(A + B, max_blocks=2)] == [2]
    assert second is not None and cache.holds(1)


def test_colliding_hashes_never_match_other_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 42)
    cache = PrefixCache(4)
    first = cache.register(None, A, block_id=0)
    assert first is not None and first.block_hash == 42
    assert cache.lookup(C + D, max_blocks=2) == []
    assert cache.register(None, C, block_id=1) is None  # collision: not registered
    assert cache.register(first, B, block_id=2) is None  # same hash again, other parent
    assert not cache.holds(1) and not cache.holds(2)
    # A's entry answers hash 42 at every depth: its tokens or its parent must not match B
    assert [e.block_id for e in cache.lookup(A + A, max_blocks=2)] == [0]
    assert [e.block_id for e in cache.lookup(A + B, max_blocks=2)] == [0]


def test_a_block_must_be_full() -> None:
    cache = PrefixCache(4)
    with pytest.raises(ValueError, match="holds 4 tokens, got 3"):
        cache.register(None, A[:3], block_id=0)
