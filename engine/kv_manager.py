"""The interface every KV strategy implements, and the figures it reports each step.

A KV manager hands out cache slots to requests and says where each token lives. The
scheduler asks it whether a request can be admitted or grown; the engine asks it for the
slot of every new token and for the per-sequence layout attention reads through, and rolls
a request back with `truncate` when speculative tokens are rejected.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from servelab.engine.request import Request


@dataclass
class KVStats:
    """One step's KV accounting, in slots (one slot holds one token's K/V in every layer)."""

    total_slots: int
    allocated_slots: int  # handed to requests (reserved or in allocated blocks)
    live_slots: int  # holding tokens of unfinished requests
    extra: dict[str, float] = field(default_factory=dict)  # strategy-specific counters

    @property
    def waste(self) -> float:
        """(allocated - live) / allocated; 0 when nothing is allocated."""
        if self.allocated_slots == 0:
            return 0.0
        return (self.allocated_slots - self.live_slots) / self.allocated_slots


def check_continues(parent: Request, child: Request) -> int:
    """The parent's computed tokens, which a forked child must repeat; ValueError if not."""
    computed = parent.num_computed_tokens
    if child.token_slice(0, computed) != parent.token_slice(0, computed):
        raise ValueError(f"request {child.id} does not continue request {parent.id}")
    return computed


class KVManager(ABC):
    """Slot allocation policy over a `KVCache` of `total_slots` slots."""

    block_size: int
    total_slots: int

    @abstractmethod
    def fits_empty(self, request: Request) -> bool:
        """Could this request ever run, in an otherwise empty cache?"""

    @abstractmethod
    def admit(self, request: Request, reserve_tokens: int = 0) -> bool:
        """Give a waiting request what it needs to start; False (and no change) if no room.

        `reserve_tokens`: a manager that reserves up front holds at least this many slots
        (static batching padding its batch to a rectangle); on-demand managers ignore it."""

    @abstractmethod
    def grow(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens after `num_computed_tokens`."""

    @abstractmethod
    def free(self, request: Request) -> None:
        """Return everything the request holds."""

    @abstractmethod
    def holds(self, request: Request) -> bool:
        """Does the request hold anything (slots, blocks, a swapped-out copy)?"""

    @abstractmethod
    def truncate(self, request: Request, num_tokens: int) -> None:
        """Keep the first `num_tokens` computed positions and release what lies past them;
        `num_computed_tokens` becomes `num_tokens` (speculative rollback)."""

    def cached_prefix_tokens(self, request: Request) -> int:
        """Leading tokens of a waiting request whose KV is cached now (0 without a cache)."""
        return 0

    @abstractmethod
    def fork(self, parent: Request, child: Request) -> bool:
        """`child` continues from `parent`'s computed tokens (its tokens equal the parent's up
        to there): it shares or copies the parent's KV and its `num_computed_tokens` becomes
        the parent's. False, and no change, if there is no room for it."""

    def preempt(self, request: Request) -> None:
        """Evict a running request; by default free everything so that it recomputes."""
        self.free(request)
        request.num_computed_tokens = 0

    @abstractmethod
    def slot_mapping(self, request: Request, start: int, end: int) -> torch.Tensor:
        """Flat slots of positions `start .. end - 1` (int64)."""

    @abstractmethod
    def layout(self, requests: list[Request]) -> dict[str, torch.Tensor | int]:
        """The `ForwardBatch` fields attention reads through (`slab_starts` or `block_tables`)."""

    @abstractmethod
    def stats(self) -> KVStats:
        """This step's accounting."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent: every slot or block
        accounted for exactly once (tests check it after every step)."""
