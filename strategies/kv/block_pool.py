"""The pool of paged-KV blocks: reference counts and two LRU queues of unreferenced blocks.

A block is in exactly one of three states. *Used*: one or more requests hold it (reference
count > 0). *Cached*: nobody holds it, but it still stores a full block of a prefix the
prefix cache can hand out again. *Free*: nobody holds it and it stores nothing worth
keeping. Unreferenced blocks wait in two queues kept in least-recently-released order: a
released block goes to the tail, and allocation takes from the head, plain free blocks
first and only then the oldest cached block (which it evicts from the prefix cache through
`on_evict`), so a cached prefix survives as long as anything else can be handed out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from servelab.base.errors import ConfigError


class BlockPool:
    def __init__(self, num_blocks: int, on_evict: Callable[[int], None]) -> None:
        if num_blocks < 1:
            raise ConfigError("engine.kv_budget", f"{num_blocks} blocks: the pool needs one")
        self.num_blocks = num_blocks
        self._on_evict = on_evict
        self._refcount = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._num_shared = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free) - len(self._cached)

    @property
    def num_available(self) -> int:
        """Blocks `allocate` can hand out: free ones, then cached ones by eviction."""
        return len(self._free) + len(self._cached)

    @property
    def num_shared(self) -> int:
        """Blocks held by more than one request."""
        return self._num_shared

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def is_free(self, block: int) -> bool:
        return block in self._free

    def free_order(self) -> list[int]:
        """Free blocks from the head (next allocated) to the tail."""
        return list(self._free)

    def cached_order(self) -> list[int]:
        """Cached blocks from the head (next evicted) to the tail."""
        return list(self._cached)

    def allocate(self) -> int:
        """A block with reference count 1: the oldest free one, else the oldest cached one."""
        if self._free:
            block, _ = self._free.popitem(last=False)
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            self._on_evict(block)
        else:
            raise RuntimeError("block pool exhausted: check num_available before allocating")
        self._refcount[block] = 1
        return block

    def acquire(self, block: int) -> None:
        """One more reference on a used block, or take a cached block back into use."""
        count = self._refcount[block]
        if count == 0:
            if block not in self._cached:
                raise RuntimeError(f"block {block} is free: only used or cached blocks are shared")
            del self._cached[block]
        elif count == 1:
            self._num_shared += 1
        self._refcount[block] = count + 1

    def release(self, block: int, cached: bool) -> None:
        """Drop one reference; at zero the block joins the tail of the cached or free queue."""
        count = self._refcount[block]
        if count == 0:
            raise RuntimeError(f"block {block} released more often than it was held")
        if count == 2:
            self._num_shared -= 1
        self._refcount[block] = count - 1
        if count == 1:
            (self._cached if cached else self._free)[block] = None

    def check_integrity(self) -> None:
        """Raise AssertionError unless every block is in exactly one state and counts agree."""
        free, cached = set(self._free), set(self._cached)
        used = {b for b, count in enumerate(self._refcount) if count > 0}
        expect(not free & cached, f"blocks both free and cached: {sorted(free & cached)}")
        expect(not used & free, f"referenced blocks in the free queue: {sorted(used & free)}")
        expect(not used & cached, f"referenced blocks in the cached queue: {sorted(used & cached)}")
        expect(
            len(free) + len(cached) + len(used) == self.num_blocks,
            f"free {len(free)} + cached {len(cached)} + used {len(used)} != {self.num_blocks}",
        )
        expect(min(self._refcount) >= 0, "negative reference count")
        shared = sum(1 for count in self._refcount if count > 1)
        expect(shared == self._num_shared, f"{shared} shared blocks, counter {self._num_shared}")


def expect(condition: bool, message: str) -> None:
    """An integrity check that holds under `python -O` too: AssertionError when it fails."""
    if not condition:
        raise AssertionError(message)
