"""The paged KV manager on its own: block tables, prefix hits, undo, swap, copy-on-write, stats.

Each simulated step grows a request, writes each new token's id into its K/V slots (so the
cache contents can be read back and checked), and advances `num_computed_tokens` as the
engine does.
"""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.request import Request, SamplingParams
from servelab.strategies.kv import KV, prefix_cache
from servelab.strategies.kv.paged import PagedConfig, PagedKVManager

CPU = torch.device("cpu")


def _manager(
    num_blocks: int = 8, block_size: int = 4, prefix: bool = False, preemption: str = "recompute"
) -> PagedKVManager:
    layout = KVLayout(num_layers=2, stored_kv_heads=1, head_dim=2, dtype=torch.float32)
    budget = num_blocks * block_size * layout.bytes_per_token
    cache = allocate_kv_cache(layout, budget, block_size, CPU)
    return PagedKVManager(PagedConfig(block_size, prefix, preemption), cache)


def _request(tokens: list[int], name: str = "r", max_tokens: int = 4) -> Request:
    return Request(name, list(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True))


def _step(manager: PagedKVManager, request: Request, count: int | None = None) -> None:
    """Grow, write the tokens' ids as their K/V in every layer, advance the computed count."""
    start = request.num_computed_tokens
    count = request.num_tokens - start if count is None else count
    assert manager.grow(request, count)
    slots = manager.slot_mapping(request, start, start + count)
    values = torch.tensor(request.all_token_ids()[start : start + count], dtype=torch.float32)
    for layer in manager.kv_cache.k + manager.kv_cache.v:
        layer.view(-1, 1, 2)[slots] = values[:, None, None]
    request.num_computed_tokens += count
    manager.check_integrity()


def _cached_tokens(manager: PagedKVManager, request: Request) -> list[list[int]]:
    """What every layer's keys and values hold at the request's computed positions."""
    slots = manager.slot_mapping(request, 0, request.num_computed_tokens)
    return [
        layer.view(-1, 1, 2)[slots][:, 0, 0].to(torch.int64).tolist()
        for layer in manager.kv_cache.k + manager.kv_cache.v
    ]


def test_slots_follow_the_block_table_and_layout_pads_with_zero() -> None:
    manager = _manager()
    first, second = _request(list(range(10, 16)), "a"), _request([20, 21, 22], "b")
    assert manager.admit(first) and manager.admit(second)
    _step(manager, first)
    _step(manager, second)
    first.output_ids += [16, 17, 18]
    _step(manager, first, 3)  # positions 6, 7, 8: block 1 fills, block 3 starts
    assert manager.block_ids(first) == [0, 1, 3]
    assert manager.block_ids(second) == [2]
    assert manager.slot_mapping(first, 0, 9).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12]
    assert manager.slot_mapping(second, 1, 3).tolist() == [9, 10]
    layout = manager.layout([second, first])
    assert layout["block_size"] == 4
    assert layout["block_tables"].dtype == torch.int32
    assert layout["block_tables"].tolist() == [[2, 0, 0], [0, 1, 3]]
    assert _cached_tokens(manager, first) == [list(range(10, 19))] * 4
    with pytest.raises(RuntimeError, match="position 12 has no block"):
        manager.slot_mapping(first, 9, 13)


def test_grow_allocates_on_demand_and_fails_without_changes() -> None:
    manager = _manager(num_blocks=3)
    first = _request(list(range(9)), "a")
    assert manager.admit(first)
    assert manager.grow(first, 5)
    assert manager.block_ids(first) == [0, 1]
    assert manager.grow(first, 9)
    assert manager.block_ids(first) == [0, 1, 2]
    second = _request([1, 2], "b")
    assert manager.admit(second)
    assert not manager.grow(second, 1)
    assert manager.block_ids(second) == []
    assert (manager.pool.num_free, manager.pool.num_used) == (0, 3)
    manager.check_integrity()


def test_free_releases_the_last_block_first() -> None:
    manager = _manager(num_blocks=6)
    request = _request(list(range(10)))
    manager.admit(request)
    _step(manager, request)
    manager.free(request)
    assert manager.pool.free_order() == [3, 4, 5, 2, 1, 0]
    manager.check_integrity()


def test_finished_prefix_blocks_stay_cached_and_the_tail_is_evicted_first() -> None:
    manager = _manager(num_blocks=4, prefix=True)
    first = _request(list(range(10)), "a")
    manager.admit(first)
    _step(manager, first)
    manager.free(first)
    # blocks 0 and 1 are full and registered; block 2 held 2 tokens and is plainly free
    assert manager.pool.cached_order() == [1, 0]
    assert manager.pool.free_order() == [3, 2]
    other = _request(list(range(100, 113)), "b")
    manager.admit(other)
    assert manager.grow(other, 13)  # four blocks: both free ones, then evict block 1, block 0
    assert manager.block_ids(other) == [3, 2, 1, 0]
    assert len(manager.prefix_cache) == 0
    manager.check_integrity()


def test_a_new_request_reusing_an_earlier_id_counts_its_hit_as_cached() -> None:
    """A server's next run sends ids "0", "1", ... again: blocks computed under the same id by
    a request that is gone are another request's, a prefix hit (only a preempted request
    finds its own blocks)."""
    manager = _manager(prefix=True)
    earlier = _request(list(range(9)), "0")
    manager.admit(earlier)
    _step(manager, earlier)
    manager.free(earlier)
    again = _request(list(range(9)), "0")
    assert manager.admit(again) and again.cached_prompt_tokens == 8
    assert manager.stats().extra["prefix_hit_tokens"] == 8
    manager.check_integrity()


def test_a_prefix_hit_stops_one_token_short_of_the_known_tokens() -> None:
    manager = _manager(prefix=True)
    first = _request(list(range(8)), "a")
    manager.admit(first)
    _step(manager, first)
    manager.free(first)
    same = _request(list(range(8)), "b")
    assert manager.admit(same)
    assert same.num_computed_tokens == 4  # block 1 would leave no token to compute
    assert same.cached_prompt_tokens == 4
    longer = _request(list(range(9)), "c")
    assert manager.admit(longer)
    assert longer.num_computed_tokens == 8
    assert manager.block_ids(longer) == [0, 1]
    assert manager.pool.refcount(0) == 2 and manager.pool.refcount(1) == 1
    stats = manager.stats().extra
    assert (stats["prefix_hit_tokens"], stats["prefix_query_tokens"]) == (12, 8 + 8 + 9)
    manager.check_integrity()


def test_shared_prefix_blocks_count_once_in_live_slots() -> None:
    manager = _manager(prefix=True)
    first = _request(list(range(8)) + [50, 51], "a")
    manager.admit(first)
    _step(manager, first)
    second = _request(list(range(8)) + [60, 61], "b")
    assert manager.admit(second)
    assert second.num_computed_tokens == 8
    assert manager.block_ids(second)[:2] == manager.block_ids(first)[:2]
    stats = manager.stats()
    assert stats.extra["kv_shared_blocks"] == 2
    assert (stats.allocated_slots, stats.live_slots) == (12, 10)
    _step(manager, second)
    stats = manager.stats()
    assert (stats.allocated_slots, stats.live_slots) == (16, 12)
    assert stats.extra["kv_internal_fragmentation"] == 4 / 16
    assert stats.extra["kv_blocks_used"] == 4 and stats.extra["kv_blocks_free"] == 4
    assert _cached_tokens(manager, second)[0] == list(range(8)) + [60, 61]
    manager.free(first)
    stats = manager.stats()
    assert stats.extra["kv_shared_blocks"] == 0
    assert (stats.allocated_slots, stats.live_slots) == (12, 10)
    assert stats.extra["kv_blocks_cached"] == 0  # first's full blocks are still held by second


def test_colliding_hashes_never_share_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefix_cache, "block_hash", lambda parent, tokens: 0)
    manager = _manager(prefix=True)
    first, second = _request(list(range(9)), "a"), _request(list(range(100, 109)), "b")
    for request in (first, second):
        manager.admit(request)
        _step(manager, request)
    assert manager.admit(_request([7], "c"))  # settles both: only first's block 0 registers
    assert len(manager.prefix_cache) == 1 and manager.prefix_cache.holds(0)
    manager.free(first)
    manager.free(second)
    other = _request(list(range(100, 109)), "d")
    assert manager.admit(other) and other.num_computed_tokens == 0
    same = _request(list(range(9)), "e")
    assert manager.admit(same) and same.num_computed_tokens == 4
    manager.check_integrity()


def test_free_right_after_admit_undoes_the_admission() -> None:
    manager = _manager(num_blocks=3, prefix=True)
    first = _request(list(range(8)), "a")
    manager.admit(first)
    _step(manager, first)
    manager.free(first)
    second = _request(list(range(8)) + [9, 9, 9, 9, 9], "b")
    assert manager.admit(second)
    assert (second.num_computed_tokens, second.cached_prompt_tokens) == (8, 8)
    assert not manager.grow(second, 5)  # needs 2 more blocks, one is free
    manager.free(second)
    assert (second.num_computed_tokens, second.cached_prompt_tokens) == (0, 0)
    stats = manager.stats().extra
    assert (stats["prefix_hit_tokens"], stats["prefix_query_tokens"]) == (0, 8)
    assert stats["kv_blocks_cached"] == 2 and stats["kv_blocks_used"] == 0
    manager.check_integrity()


def test_recompute_preemption_frees_everything() -> None:
    manager = _manager()
    request = _request(list(range(6)))
    manager.admit(request)
    _step(manager, request)
    request.output_ids.append(7)
    _step(manager, request, 1)  # a step ran after admission: free must not undo anything
    manager.preempt(request)
    assert request.num_computed_tokens == 0
    assert manager.pool.num_free == 8
    manager.check_integrity()


def test_swap_preemption_restores_the_blocks_on_the_next_admission() -> None:
    manager = _manager(num_blocks=4, preemption="swap")
    first = _request(list(range(30, 36)), "a")
    manager.admit(first)
    _step(manager, first)
    manager.preempt(first)
    assert first.num_computed_tokens == 6
    assert manager.pool.num_free == 4
    assert manager.stats().extra["swapped_out_blocks"] == 2
    second = _request(list(range(40, 49)), "b")
    manager.admit(second)
    _step(manager, second)  # overwrites blocks 2, 3 and 1
    assert not manager.admit(first)  # one block free, two needed
    assert manager.stats().extra["swapped_out_blocks"] == 2
    manager.free(second)
    assert manager.admit(first)
    assert first.num_computed_tokens == 6
    manager.free(first)  # no step ran: back to host memory, nothing lost
    assert manager.stats().extra["swapped_out_blocks"] == 2
    assert first.num_computed_tokens == 6
    assert manager.admit(first)
    assert manager.stats().extra["swapped_out_blocks"] == 0
    assert _cached_tokens(manager, first) == [list(range(30, 36))] * 4
    first.output_ids.append(36)
    _step(manager, first, 1)
    assert _cached_tokens(manager, first) == [list(range(30, 37))] * 4


def test_fork_shares_blocks_and_copies_the_partial_one_on_write() -> None:
    manager = _manager(prefix=True)
    parent = _request([1, 2, 3, 4, 5, 6], "parent")
    manager.admit(parent)
    _step(manager, parent)
    child = _request([1, 2, 3, 4, 5, 6], "child")
    manager.fork(parent, child)
    assert child.num_computed_tokens == 6
    assert manager.block_ids(child) == manager.block_ids(parent) == [0, 1]
    assert [manager.pool.refcount(b) for b in (0, 1)] == [2, 2]
    manager.check_integrity()
    parent.output_ids.append(100)
    _step(manager, parent, 1)  # position 6 is in shared block 1: the parent gets a copy
    assert manager.block_ids(parent) == [0, 2]
    assert manager.block_ids(child) == [0, 1]
    assert [manager.pool.refcount(b) for b in (0, 1, 2)] == [2, 1, 1]
    child.output_ids.append(200)
    _step(manager, child, 1)  # block 1 is the child's alone now: written in place
    assert manager.block_ids(child) == [0, 1]
    assert _cached_tokens(manager, parent) == [[1, 2, 3, 4, 5, 6, 100]] * 4
    assert _cached_tokens(manager, child) == [[1, 2, 3, 4, 5, 6, 200]] * 4
    assert manager.stats().extra["kv_shared_blocks"] == 1
    with pytest.raises(ValueError, match="does not continue"):
        manager.fork(parent, _request([1, 2, 3, 9, 9, 9, 9], "stranger"))


def test_integrity_check_catches_a_table_that_disagrees_with_the_pool() -> None:
    manager = _manager()
    request = _request([1, 2, 3])
    manager.admit(request)
    _step(manager, request)
    manager._tables[request].replace(0, 5)
    with pytest.raises(AssertionError, match="block 0: 0 table references, refcount 1"):
        manager.check_integrity()


def test_fits_empty_counts_whole_blocks() -> None:
    manager = _manager(num_blocks=4)
    assert manager.fits_empty(_request(list(range(12)), max_tokens=4))
    assert not manager.fits_empty(_request(list(range(12)), max_tokens=5))


def test_bad_settings_are_one_line_config_errors() -> None:
    with pytest.raises(ConfigError, match="strategy.preemption: 'drop' is not one of"):
        KV.choose({"kv": "paged", "preemption": "drop"})
    with pytest.raises(ConfigError, match="strategy.block_size: 0 must be at least 1"):
        KV.choose({"kv": "paged", "block_size": 0})
