"""Speculative rollback on both KV managers: `truncate` after drafts were fed and rejected.

Each simulated verification feeds the last known token and the drafts (growing the request
as the scheduler does), advances `num_computed_tokens` as the engine does, appends what the
target accepted and truncates to the verified length, as `Engine._accept` does.
"""

from __future__ import annotations

import pytest
import torch

from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.request import Request, SamplingParams
from servelab.strategies.kv.contiguous import ContiguousKVManager
from servelab.strategies.kv.paged import PagedConfig, PagedKVManager

CPU = torch.device("cpu")


def _paged(num_blocks: int = 8, block_size: int = 4) -> PagedKVManager:
    layout = KVLayout(num_layers=1, stored_kv_heads=1, head_dim=2, dtype=torch.float32)
    budget = num_blocks * block_size * layout.bytes_per_token
    cache = allocate_kv_cache(layout, budget, block_size, CPU)
    return PagedKVManager(PagedConfig(block_size, True, "recompute"), cache)


def _request(prompt: list[int], name: str = "r") -> Request:
    return Request(name, list(prompt), SamplingParams(max_tokens=16, ignore_eos=True))


def _prefill(manager, request: Request, first_token: int) -> None:
    assert manager.grow(request, request.num_tokens - request.num_computed_tokens)
    request.num_computed_tokens = request.num_tokens
    request.output_ids.append(first_token)


def _verify(manager, request: Request, drafts: list[int], appended: list[int]) -> None:
    """Feed [last token, drafts], append `appended` (accepted drafts + the target's token),
    roll back past what was not verified."""
    request.draft_ids = list(drafts)
    known = request.num_tokens
    assert manager.grow(request, request.num_pending_tokens)
    request.num_computed_tokens += request.num_pending_tokens
    request.draft_ids = []
    request.output_ids += appended
    manager.truncate(request, known + len(appended) - 1)


def test_paged_rollback_returns_the_blocks_past_the_accepted_length() -> None:
    manager = _paged()
    request = _request(list(range(10, 16)))  # 6 prompt tokens: blocks 0 and 1
    assert manager.admit(request)
    _prefill(manager, request, 16)
    # position 6 (token 16) and five drafts at 7..11: block 2 is allocated for 8..11
    _verify(manager, request, [17, 18, 19, 20, 21], [17, 99])
    assert request.num_computed_tokens == 8  # 16 and the accepted 17 hold KV; 99 is next
    assert manager.block_ids(request) == [0, 1]
    assert manager.pool.free_order()[-1] == 2  # back at the tail of the free queue
    assert manager.pool.num_used == 2
    manager.check_integrity()


def test_paged_prefix_cache_never_holds_rejected_drafts() -> None:
    manager = _paged()
    request = _request(list(range(10, 18)), "a")  # 8 prompt tokens: two full blocks
    assert manager.admit(request)
    _prefill(manager, request, 18)
    # drafts 19..23 fill block 2 (positions 8..11) with 18, 19, 20, 21; every draft rejected
    _verify(manager, request, [19, 20, 21, 22, 23], [50])
    assert manager.block_ids(request) == [0, 1, 2]  # block 3 (positions 12, 13) returned
    _verify(manager, request, [60, 61, 62], [60, 61, 62, 63])  # all accepted, bonus 63
    manager.check_integrity()
    verified = tuple(request.all_token_ids())
    manager.free(request)
    assert manager.prefix_cache.prefixes()  # full verified blocks stay cached ...
    assert all(verified[: len(p)] == p for p in manager.prefix_cache.prefixes())
    # ... and a prompt made of the rejected drafts finds only the two prompt blocks
    rejected = _request([*range(10, 18), 18, 19, 20, 21, 22, 23, 7], "b")
    assert manager.cached_prefix_tokens(rejected) == 8
    accepted = _request([*verified, 7], "c")
    assert manager.cached_prefix_tokens(accepted) == 12  # blocks 0..2; block 3 is partial
    manager.check_integrity()


def test_truncate_never_moves_forward() -> None:
    paged = _paged()
    contiguous = ContiguousKVManager(64)
    for manager in (paged, contiguous):
        request = _request([1, 2, 3])
        assert manager.admit(request)
        _prefill(manager, request, 4)
        with pytest.raises(ValueError, match="cannot truncate forward"):
            manager.truncate(request, 4)


def test_contiguous_rollback_keeps_the_whole_slab_and_counts_only_verified_tokens() -> None:
    manager = ContiguousKVManager(64)
    other = _request([5, 6])
    request = _request([1, 2, 3])
    assert manager.admit(other) and manager.admit(request)
    slots = manager.slot_mapping(request, 0, 19)
    _prefill(manager, request, 4)
    _verify(manager, request, [5, 6, 7], [5, 8])
    assert request.num_computed_tokens == 5
    assert manager.slot_mapping(request, 0, 19).tolist() == slots.tolist()
    stats = manager.stats()
    assert (stats.allocated_slots, stats.live_slots) == (18 + 19, 5)
    assert not manager.grow(request, 15)  # the slab still ends at prompt + max_tokens
    assert manager.grow(request, 14)
