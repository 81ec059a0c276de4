"""The paged-KV block pool: allocation and LRU orders, reference counts, integrity."""

from __future__ import annotations

import random

import pytest

from servelab.base.errors import ConfigError
from servelab.strategies.kv.block_pool import BlockPool


def _pool(num_blocks: int) -> tuple[BlockPool, list[int]]:
    evicted: list[int] = []
    return BlockPool(num_blocks, evicted.append), evicted


def test_allocates_in_order_and_reuses_released_blocks_oldest_first() -> None:
    pool, evicted = _pool(4)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    assert (pool.num_free, pool.num_cached, pool.num_used) == (0, 0, 4)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.allocate()
    pool.release(2, cached=False)
    pool.release(0, cached=False)
    assert pool.free_order() == [2, 0]
    assert pool.allocate() == 2
    assert pool.allocate() == 0
    assert evicted == []
    pool.check_integrity()


def test_free_blocks_go_before_cached_ones_and_cached_ones_leave_least_recent_first() -> None:
    pool, evicted = _pool(4)
    for _ in range(4):
        pool.allocate()
    pool.release(1, cached=True)
    pool.release(3, cached=False)
    pool.release(0, cached=True)
    pool.release(2, cached=True)
    assert pool.cached_order() == [1, 0, 2]
    assert pool.free_order() == [3]
    assert pool.num_available == 4
    assert [pool.allocate() for _ in range(3)] == [3, 1, 0]
    assert evicted == [1, 0]
    assert pool.cached_order() == [2]
    pool.check_integrity()


def test_reference_counts_sharing_and_taking_a_cached_block_back() -> None:
    pool, evicted = _pool(3)
    block = pool.allocate()
    pool.acquire(block)
    pool.acquire(block)
    assert pool.refcount(block) == 3
    assert pool.num_shared == 1
    pool.release(block, cached=True)
    assert pool.num_shared == 1
    pool.release(block, cached=True)
    assert pool.num_shared == 0
    pool.release(block, cached=True)
    assert pool.is_cached(block) and pool.refcount(block) == 0
    pool.acquire(block)  # a prefix hit takes it back without evicting it
    assert pool.refcount(block) == 1 and not pool.is_cached(block)
    assert evicted == []
    with pytest.raises(RuntimeError, match="is free"):
        pool.acquire(2)
    pool.release(block, cached=False)
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(block, cached=False)
    pool.check_integrity()


def test_integrity_survives_random_operation_sequences() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        pool, evicted = _pool(6)
        held: list[int] = []
        cached_flag: dict[int, bool] = {}
        for _ in range(200):
            action = rng.random()
            if action < 0.4 and pool.num_available:
                from_free = pool.num_free > 0
                expected = (pool.free_order() if from_free else pool.cached_order())[0]
                evictions = len(evicted)
                block = pool.allocate()
                assert block == expected
                assert evicted[evictions:] == ([] if from_free else [block])
                held.append(block)
                cached_flag[block] = rng.random() < 0.5
            elif action < 0.6 and held:
                block = rng.choice(held)
                pool.acquire(block)
                held.append(block)
            elif action < 0.75 and pool.num_cached:
                block = pool.cached_order()[rng.randrange(pool.num_cached)]
                pool.acquire(block)
                held.append(block)
            elif held:
                block = held.pop(rng.randrange(len(held)))
                pool.release(block, cached=cached_flag[block])
            pool.check_integrity()
            for block in range(6):
                assert pool.refcount(block) == held.count(block)
            assert pool.num_used == len(set(held))
        assert pool.num_free + pool.num_cached + pool.num_used == 6


def test_integrity_check_catches_a_corrupted_pool() -> None:
    pool, _ = _pool(3)
    block = pool.allocate()
    pool._refcount[block] = 0  # lost reference: the block is in no state at all
    with pytest.raises(AssertionError, match="free 2 \\+ cached 0 \\+ used 0 != 3"):
        pool.check_integrity()
    pool, _ = _pool(3)
    pool._refcount[0] = 1  # held and free at once
    with pytest.raises(AssertionError, match="referenced blocks in the free queue"):
        pool.check_integrity()


def test_a_pool_needs_a_block() -> None:
    with pytest.raises(ConfigError, match="engine.kv_budget"):
        BlockPool(0, lambda block: None)
