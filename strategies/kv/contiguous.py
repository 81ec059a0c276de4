"""Contiguous KV: one slab of consecutive slots per request, reserved for prompt + max output.

This is what servers before PagedAttention did (FasterTransformer, Orca): the whole
maximum length is reserved at admission, so a request that stops early leaves its tail
unused, and free space fragments between slabs. Both show in the accounting. Nothing is
shared: each sample of a request for n samples reserves a slab of its own, into which the
prompt's KV is copied.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from servelab.engine.kv_cache import KVCache
from servelab.engine.kv_manager import KVManager, KVStats, check_continues
from servelab.engine.request import Request
from servelab.strategies.kv.block_pool import expect
from servelab.strategies.registry import Option

if TYPE_CHECKING:
    from servelab.strategies.factories import KVOption


@dataclass(frozen=True)
class ContiguousConfig:
    @property
    def cache_block_size(self) -> int:
        """Slabs are addressed slot by slot."""
        return 1


class ContiguousKVManager(KVManager):
    """First-fit slab allocation over a flat slot space."""

    def __init__(self, total_slots: int, kv_cache: KVCache | None = None) -> None:
        """`kv_cache`: the slots' tensors, which `fork` copies between (None: accounting
        only, as in the allocator's own tests; `fork` then refuses)."""
        self.block_size = 1
        self.total_slots = total_slots
        self.kv_cache = kv_cache
        self._free: list[tuple[int, int]] = [(0, total_slots)]  # sorted (start, length)
        self._slabs: dict[Request, tuple[int, int]] = {}

    def fits_empty(self, request: Request) -> bool:
        return request.max_total_tokens <= self.total_slots

    def admit(self, request: Request, reserve_tokens: int = 0) -> bool:
        need = max(request.max_total_tokens, reserve_tokens)
        for index, (start, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[index]
                else:
                    self._free[index] = (start + need, length - need)
                self._slabs[request] = (start, need)
                return True
        return False

    def grow(self, request: Request, num_new_tokens: int) -> bool:
        return request.num_computed_tokens + num_new_tokens <= self._slabs[request][1]

    def fork(self, parent: Request, child: Request) -> bool:
        """A slab of the child's own, the parent's computed KV copied into it."""
        if self.kv_cache is None:
            raise RuntimeError("this contiguous manager has no cache tensors to copy between")
        computed = check_continues(parent, child)
        if not self.admit(child):
            return False
        source, target = self._slabs[parent][0], self._slabs[child][0]
        for layer in self.kv_cache.k + self.kv_cache.v:  # block size 1: a block is a slot
            layer[target : target + computed].copy_(layer[source : source + computed])
        child.num_computed_tokens = computed
        return True

    def truncate(self, request: Request, num_tokens: int) -> None:
        if num_tokens > request.num_computed_tokens:
            raise ValueError(f"request {request.id}: cannot truncate forward to {num_tokens}")
        request.num_computed_tokens = num_tokens  # the slab stays reserved whole

    def holds(self, request: Request) -> bool:
        return request in self._slabs

    def free(self, request: Request) -> None:
        start, length = self._slabs.pop(request)
        index = bisect.bisect(self._free, (start, length))
        self._free.insert(index, (start, length))
        self._merge_around(index)

    def _merge_around(self, index: int) -> None:
        if index + 1 < len(self._free):
            start, length = self._free[index]
            next_start, next_length = self._free[index + 1]
            if start + length == next_start:
                self._free[index] = (start, length + next_length)
                del self._free[index + 1]
        if index > 0:
            prev_start, prev_length = self._free[index - 1]
            start, length = self._free[index]
            if prev_start + prev_length == start:
                self._free[index - 1] = (prev_start, prev_length + length)
                del self._free[index]

    def slot_mapping(self, request: Request, start: int, end: int) -> torch.Tensor:
        base = self._slabs[request][0]
        return torch.arange(base + start, base + end, dtype=torch.int64)

    def layout(self, requests: list[Request]) -> dict[str, torch.Tensor | int]:
        starts = [self._slabs[r][0] for r in requests]
        return {"slab_starts": torch.tensor(starts, dtype=torch.int64), "block_size": 1}

    def stats(self) -> KVStats:
        allocated = sum(length for _, length in self._slabs.values())
        live = sum(r.num_computed_tokens for r in self._slabs if not r.is_finished)
        largest_free = max((length for _, length in self._free), default=0)
        free = self.total_slots - allocated
        return KVStats(
            total_slots=self.total_slots,
            allocated_slots=allocated,
            live_slots=live,
            extra={
                "kv_slabs": len(self._slabs),
                "kv_external_fragmentation": 0.0 if free == 0 else 1 - largest_free / free,
            },
        )

    def check_integrity(self) -> None:
        """Raise AssertionError unless free runs and slabs tile the slot space exactly once
        (sorted, disjoint, adjacent free runs merged) and no request computed past its slab
        (for tests)."""
        runs = sorted(
            [(s, n, "free") for s, n in self._free]
            + [(s, n, f"request {r.id}") for r, (s, n) in self._slabs.items()]
        )
        expect(self._free == sorted(self._free), "free runs out of order")
        position = 0
        for start, length, owner in runs:
            expect(length > 0, f"{owner}: empty run at slot {start}")
            expect(start == position, f"{owner} starts at slot {start}, expected {position}")
            position = start + length
        expect(position == self.total_slots, f"runs cover {position} of {self.total_slots} slots")
        for (start, length), (after, _) in zip(self._free, self._free[1:], strict=False):
            expect(start + length < after, f"free runs at {start} and {after} not merged")
        for request, (_, length) in self._slabs.items():
            expect(
                request.num_computed_tokens <= length,
                f"request {request.id} computed tokens beyond its slab",
            )


CONTIGUOUS: KVOption = Option(
    name="contiguous",
    summary="one slab per request, reserved for prompt + max output (FasterTransformer, Orca)",
    config=ContiguousConfig,
    build=lambda config, cache: ContiguousKVManager(cache.num_slots, cache),
)
