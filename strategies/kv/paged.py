"""Paged KV (vLLM's PagedAttention): fixed-size blocks handed out on demand via block tables.

Position `p` of a request lives in slot `table[p // B] * B + p % B`. A request gets blocks
only as its computed tokens reach them, so what a request that stops early leaves unused is
at most the tail of its last block. With prefix caching, every block that fills with computed
tokens is registered in the prefix cache; a new request takes references on the registered
blocks that match its first tokens (they are shared, not copied) and skips computing them.
A released block that is registered stays reusable until the pool evicts it (LRU).

Preemption frees a request's blocks and recomputes it later (the prefix cache may hand much
of it back), or with `swap` copies its blocks to host memory and restores them on the next
admission. A request that writes into a block it shares (after `fork`, as in parallel
sampling) first gets its own copy of that block (copy-on-write).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from servelab.engine.kv_cache import KVCache
from servelab.engine.kv_manager import KVManager, KVStats, check_continues
from servelab.engine.request import Request
from servelab.strategies.kv.block_pool import BlockPool, expect
from servelab.strategies.kv.prefix_cache import CachedBlock, PrefixCache
from servelab.strategies.kv.swap import SwappedKV, copy_block, swap_in, swap_out
from servelab.strategies.registry import Option

if TYPE_CHECKING:
    from servelab.strategies.factories import KVOption

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class PagedConfig:
    block_size: int = field(default=16, metadata={"minimum": 1, "help": "tokens per block"})
    prefix_caching: bool = field(
        default=True, metadata={"help": "reuse the blocks of a cached prompt prefix"}
    )
    preemption: str = field(
        default="recompute",
        metadata={"choices": PREEMPTION_MODES, "help": "free and recompute, or swap to host"},
    )

    @property
    def cache_block_size(self) -> int:
        return self.block_size


class BlockTable:
    """One request's block ids, appended to in place; their int32 tensor is made when a
    forward asks for it and kept until the ids change (a simulated forward never asks, and
    writing each new id into a tensor was a tenth of a simulated step)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._tensor: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            self._tensor = torch.tensor(self.ids, dtype=torch.int32)
        return self._tensor

    def append(self, block: int) -> None:
        self.ids.append(block)
        self._tensor = None

    def replace(self, index: int, block: int) -> None:
        self.ids[index] = block
        self._tensor = None

    def pop(self) -> int:
        self._tensor = None
        return self.ids.pop()


@dataclass
class _Admission:
    """What `free` undoes when an admitted request is released before it ran a step."""

    computed: int  # num_computed_tokens right after admission
    hit_tokens: int  # in blocks other requests computed
    self_hit_tokens: int  # in blocks this request computed before it was preempted
    query_tokens: int
    swapped: SwappedKV | None  # the host copy a swap-in restored


class PagedKVManager(KVManager):
    def __init__(self, config: PagedConfig, kv_cache: KVCache) -> None:
        """Manage `kv_cache`, allocated in blocks of `config.block_size` (`build_engine` sizes
        it so; the registry checked the config)."""
        block_size = kv_cache.block_size
        self.block_size = block_size
        self.num_blocks = kv_cache.num_blocks
        self.total_slots = self.num_blocks * block_size
        self.prefix_caching = config.prefix_caching
        self.preemption = config.preemption
        self.kv_cache = kv_cache
        self.prefix_cache = PrefixCache(block_size)
        self.pool = BlockPool(self.num_blocks, self.prefix_cache.evict)
        self._tables: dict[Request, BlockTable] = {}
        self._chains: dict[Request, list[CachedBlock]] = {}  # entries of the leading full blocks
        self._admissions: dict[Request, _Admission] = {}
        self._swapped: dict[Request, SwappedKV] = {}
        self._hit_tokens = 0
        self._self_hit_tokens = 0
        self._query_tokens = 0

    def fits_empty(self, request: Request) -> bool:
        return -(-request.max_total_tokens // self.block_size) <= self.num_blocks

    def block_ids(self, request: Request) -> list[int]:
        """The request's block table, first block first (a copy)."""
        return list(self._tables[request].ids)

    def admit(self, request: Request, reserve_tokens: int = 0) -> bool:
        """Start a request: restore its swapped blocks, or take refs on its cached prefix.

        Only a swap-in can fail (too few blocks for the swapped copy); a prefix hit always fits,
        because its blocks are held already or sit in the cached queue. Blocks are allocated
        as tokens arrive, so `reserve_tokens` asks for nothing up front. A hit counts as a
        prefix hit only in blocks another request computed; a preempted request finding its
        own blocks again is counted apart, and its second lookup is not a new query.
        """
        if request in self._tables:
            raise RuntimeError(f"request {request.id} is admitted already")
        swapped = self._swapped.get(request)
        if swapped is not None:
            return self._swap_in(request, swapped)
        hits = self._lookup(request)
        table = BlockTable()
        for entry in hits:
            self.pool.acquire(entry.block_id)
            table.append(entry.block_id)
        size = self.block_size
        hit = len(hits) * size
        # only a preempted request can find its own blocks: an id seen again on a request
        # never preempted is another request's (a client reusing ids, or a server's next run)
        mine = request.preemptions > 0
        own = sum(size for entry in hits if mine and entry.computed_by == request.id)
        query = request.num_tokens if self.prefix_caching and not request.preemptions else 0
        self._tables[request] = table
        self._chains[request] = hits
        self._admissions[request] = _Admission(hit, hit - own, own, query, None)
        self._hit_tokens += hit - own
        self._self_hit_tokens += own
        self._query_tokens += query
        request.num_computed_tokens = hit
        others = [i for i, entry in enumerate(hits) if not mine or entry.computed_by != request.id]
        request.cached_prompt_tokens = min(len(others) * size, request.prompt_len)
        return True

    def cached_prefix_tokens(self, request: Request) -> int:
        return len(self._lookup(request)) * self.block_size

    def _lookup(self, request: Request) -> list[CachedBlock]:
        """Cached leading blocks, leaving at least the last known token to compute."""
        if not self.prefix_caching:
            return []
        for holder in self._tables:  # register blocks filled since their holders last grew
            self._settle(holder)
        limit = (request.num_tokens - 1) // self.block_size
        return self.prefix_cache.lookup(request.all_token_ids(), limit)

    def _swap_in(self, request: Request, swapped: SwappedKV) -> bool:
        if self.pool.num_available < swapped.num_blocks:
            return False
        del self._swapped[request]
        table = BlockTable()
        for _ in range(swapped.num_blocks):
            table.append(self.pool.allocate())
        swap_in(self.kv_cache, swapped, table.ids)
        self._tables[request] = table
        self._chains[request] = []
        self._admissions[request] = _Admission(request.num_computed_tokens, 0, 0, 0, swapped)
        return True

    def grow(self, request: Request, num_new_tokens: int) -> bool:
        table = self._tables[request]
        self._settle(request)
        if num_new_tokens <= 0:
            return True
        size = self.block_size
        start = request.num_computed_tokens
        end = start + num_new_tokens
        written = range(start // size, min((end - 1) // size + 1, len(table)))
        copies = [index for index in written if self._must_copy(table.ids[index])]
        new_blocks = max(0, -(-end // size) - len(table))
        if new_blocks + len(copies) > self.pool.num_available:
            return False
        for index in copies:
            self._copy_on_write(table, index)
        for _ in range(new_blocks):
            table.append(self.pool.allocate())
        return True

    def _must_copy(self, block: int) -> bool:
        """Writing into a shared block, or one the prefix cache names, would corrupt others."""
        return self.pool.refcount(block) > 1 or self.prefix_cache.holds(block)

    def _copy_on_write(self, table: BlockTable, index: int) -> None:
        old = table.ids[index]
        new = self.pool.allocate()
        copy_block(self.kv_cache, old, new)
        table.replace(index, new)
        self.pool.release(old, cached=self.prefix_cache.holds(old))

    def _settle(self, request: Request) -> None:
        """Catch up with the steps run since the last call: register newly full blocks."""
        admission = self._admissions.get(request)
        if admission is not None and request.num_computed_tokens != admission.computed:
            del self._admissions[request]
        if not self.prefix_caching:
            return
        chain = self._chains[request]
        table = self._tables[request]
        full = min(request.num_computed_tokens // self.block_size, len(table))
        del chain[full:]  # a rollback un-computes blocks; their registered content stays valid
        while len(chain) < full:
            index = len(chain)
            entry = self.prefix_cache.register(
                chain[-1] if chain else None,
                self._block_tokens(request, index),
                table.ids[index],
                request.id,
            )
            if entry is None:
                return
            chain.append(entry)

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.token_slice(start, start + self.block_size))

    def holds(self, request: Request) -> bool:
        return request in self._tables or request in self._swapped

    def free(self, request: Request) -> None:
        """Release everything, last block first; undo an admission that never ran a step."""
        if self._swapped.pop(request, None) is not None:
            return
        admission = self._admissions.pop(request, None)
        undo = admission is not None and request.num_computed_tokens == admission.computed
        if not undo:
            self._settle(request)
        self._release(request)
        if admission is not None and undo:
            self._undo(request, admission)

    def _undo(self, request: Request, admission: _Admission) -> None:
        self._hit_tokens -= admission.hit_tokens
        self._self_hit_tokens -= admission.self_hit_tokens
        self._query_tokens -= admission.query_tokens
        if admission.swapped is not None:
            self._swapped[request] = admission.swapped
            return
        request.num_computed_tokens = 0
        request.cached_prompt_tokens = 0

    def truncate(self, request: Request, num_tokens: int) -> None:
        """Roll back to `num_tokens` computed positions; blocks past the last one they need
        return to the pool. Only verified tokens were ever registered (registration follows
        `num_computed_tokens`), so rejected drafts never enter the prefix cache."""
        if num_tokens > request.num_computed_tokens:
            raise ValueError(f"request {request.id}: cannot truncate forward to {num_tokens}")
        request.num_computed_tokens = num_tokens
        self._admissions.pop(request, None)
        table = self._tables[request]
        del self._chains[request][num_tokens // self.block_size :]
        keep = -(-num_tokens // self.block_size)
        while len(table) > keep:
            block = table.pop()
            self.pool.release(block, cached=self.prefix_cache.holds(block))

    def _release(self, request: Request) -> None:
        table = self._tables.pop(request)
        del self._chains[request]
        for block in reversed(table.ids):
            self.pool.release(block, cached=self.prefix_cache.holds(block))

    def preempt(self, request: Request) -> None:
        if self.preemption == "recompute":
            super().preempt(request)
            return
        self._settle(request)
        self._admissions.pop(request, None)
        computed = -(-request.num_computed_tokens // self.block_size)
        self._swapped[request] = swap_out(self.kv_cache, self._tables[request].ids[:computed])
        self._release(request)

    def fork(self, parent: Request, child: Request) -> bool:
        """`child` shares every block of `parent` and continues from its computed tokens
        (always room: nothing is allocated until the first write into a shared block copies
        it, see `grow`). The child's tokens must equal the parent's up to there."""
        if child in self._tables or child in self._swapped:
            raise RuntimeError(f"request {child.id} holds KV already")
        computed = check_continues(parent, child)
        self._settle(parent)
        table = BlockTable()
        for block in self._tables[parent].ids:
            self.pool.acquire(block)
            table.append(block)
        self._tables[child] = table
        self._chains[child] = list(self._chains[parent])
        child.num_computed_tokens = computed
        return True

    def slot_mapping(self, request: Request, start: int, end: int) -> torch.Tensor:
        table = self._tables[request]
        if end > len(table) * self.block_size:
            raise RuntimeError(f"request {request.id}: position {end - 1} has no block; grow first")
        positions = torch.arange(start, end, dtype=torch.int64)
        blocks = table.tensor[positions // self.block_size].to(torch.int64)
        return blocks * self.block_size + positions % self.block_size

    def layout(self, requests: list[Request]) -> dict[str, torch.Tensor | int]:
        tables = [self._tables[r] for r in requests]
        width = max((len(t) for t in tables), default=1)
        block_tables = torch.zeros((len(tables), max(width, 1)), dtype=torch.int32)
        for row, table in zip(block_tables, tables, strict=True):
            row[: len(table)] = table.tensor
        return {"block_tables": block_tables, "block_size": self.block_size}

    def stats(self) -> KVStats:
        allocated = self.pool.num_used * self.block_size
        filled, live = self._filled_slots()
        extra: dict[str, float] = {
            "kv_blocks_used": self.pool.num_used,
            "kv_blocks_cached": self.pool.num_cached,
            "kv_blocks_free": self.pool.num_free,
            "kv_shared_blocks": self.pool.num_shared,
            "kv_internal_fragmentation": 0.0 if allocated == 0 else 1 - filled / allocated,
            "prefix_hit_tokens": self._hit_tokens,
            "prefix_self_hit_tokens": self._self_hit_tokens,
            "prefix_query_tokens": self._query_tokens,
        }
        if self.preemption == "swap":
            extra["swapped_out_blocks"] = sum(s.num_blocks for s in self._swapped.values())
        return KVStats(
            total_slots=self.total_slots, allocated_slots=allocated, live_slots=live, extra=extra
        )

    def _filled_slots(self) -> tuple[int, int]:
        """Slots of used blocks holding computed tokens: of anyone, and of unfinished requests.

        A shared block's tokens count once: per block, the fullest holder's count.
        """
        size = self.block_size
        held = [(t, min(r.num_computed_tokens, len(t) * size), r) for r, t in self._tables.items()]
        if self.pool.num_shared == 0:
            filled = sum(count for _, count, _ in held)
            return filled, sum(count for _, count, r in held if not r.is_finished)
        return self._distinct_slots(held), self._distinct_slots(
            [h for h in held if not h[2].is_finished]
        )

    def _distinct_slots(self, held: list[tuple[BlockTable, int, Request]]) -> int:
        if not held:
            return 0
        size = self.block_size
        blocks = torch.cat([table.tensor for table, _, _ in held]).to(torch.int64)
        fills = torch.cat(
            [
                (count - torch.arange(len(table), dtype=torch.int64) * size).clamp(0, size)
                for table, count, _ in held
            ]
        )
        per_block = torch.zeros(self.num_blocks, dtype=torch.int64)
        return int(per_block.scatter_reduce_(0, blocks, fills, "amax").sum())

    def check_integrity(self) -> None:
        """Raise AssertionError unless pool, block tables and prefix cache agree (for tests)."""
        self.pool.check_integrity()
        refs = [0] * self.num_blocks
        for request, table in self._tables.items():
            expect(len(set(table.ids)) == len(table), f"request {request.id} repeats a block")
            expect(table.tensor.tolist() == table.ids, f"request {request.id}: stale tensor view")
            expect(
                request.num_computed_tokens <= len(table) * self.block_size,
                f"request {request.id} computed tokens beyond its blocks",
            )
            for index, entry in enumerate(self._chains[request]):
                expect(
                    entry.tokens == self._block_tokens(request, index),
                    f"request {request.id}: block {index} registered with other tokens",
                )
            for block in table.ids:
                refs[block] += 1
        for block, count in enumerate(refs):
            expect(
                count == self.pool.refcount(block),
                f"block {block}: {count} table references, refcount {self.pool.refcount(block)}",
            )
            registered = self.prefix_cache.holds(block)
            expect(
                not (self.pool.is_cached(block) and not registered),
                f"block {block} is cached but not registered",
            )
            expect(
                not (self.pool.is_free(block) and registered),
                f"block {block} is free but still registered",
            )
        expect(
            not self._tables.keys() & self._swapped.keys(),
            "a request both holds blocks and is swapped out",
        )


PAGED: KVOption = Option(
    name="paged",
    summary="vLLM: fixed-size blocks on demand, block tables, prefix sharing, preemption",
    config=PagedConfig,
    build=PagedKVManager,
)
