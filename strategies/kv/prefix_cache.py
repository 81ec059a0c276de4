"""Prefix caching: full KV blocks found again by a chained hash of their token ids.

A block that holds `block_size` computed tokens is registered under
`block_hash(parent hash, its token ids)`, where the parent is the block before it in the same
sequence, so one hash names a whole prefix. A lookup walks a sequence's full blocks from the
start and stops at the first miss. Hashes may collide, so a match must also have the same
token ids and the very entry already matched as its parent (compared by identity: an entry
whose parent was evicted can never be reached again, even if its hash is reused).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """The chained hash of one full block."""
    return hash((parent, tokens))


@dataclass(eq=False)
class CachedBlock:
    """One registered block: its hash, its tokens, the entry before it, where it lives, and
    the request that computed it."""

    block_hash: int
    tokens: tuple[int, ...]
    parent: CachedBlock | None
    block_id: int
    computed_by: str = ""


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._by_hash: dict[int, CachedBlock] = {}
        self._by_block: dict[int, CachedBlock] = {}

    def __len__(self) -> int:
        return len(self._by_block)

    def holds(self, block_id: int) -> bool:
        """Is this block registered (so that it stays reusable after its last holder leaves)?"""
        return block_id in self._by_block

    def entry(self, block_id: int) -> CachedBlock | None:
        return self._by_block.get(block_id)

    def prefixes(self) -> list[tuple[int, ...]]:
        """Every registered block's whole prefix: its tokens after all its parents' (checks)."""
        found = []
        for entry in self._by_block.values():
            chain: list[CachedBlock] = []
            node: CachedBlock | None = entry
            while node is not None:
                chain.append(node)
                node = node.parent
            found.append(tuple(t for block in reversed(chain) for t in block.tokens))
        return found

    def lookup(self, tokens: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        """The longest run of registered blocks equal to the first whole blocks of `tokens`."""
        size = self.block_size
        hits: list[CachedBlock] = []
        parent: CachedBlock | None = None
        for index in range(min(max_blocks, len(tokens) // size)):
            chunk = tuple(tokens[index * size : (index + 1) * size])
            key = block_hash(None if parent is None else parent.block_hash, chunk)
            found = self._by_hash.get(key)
            if found is None or found.parent is not parent or found.tokens != chunk:
                break
            hits.append(found)
            parent = found
        return hits

    def register(
        self,
        parent: CachedBlock | None,
        tokens: tuple[int, ...],
        block_id: int,
        computed_by: str = "",
    ) -> CachedBlock | None:
        """Register a full block after `parent`; returns the entry now naming this content.

        If the same content is already registered in another block, that entry is returned and
        `block_id` stays unregistered. None on a hash collision with different content: the
        block and everything after it in its sequence then stay unregistered.
        """
        if len(tokens) != self.block_size:
            raise ValueError(f"a block holds {self.block_size} tokens, got {len(tokens)}")
        key = block_hash(None if parent is None else parent.block_hash, tokens)
        existing = self._by_hash.get(key)
        if existing is not None:
            same = existing.parent is parent and existing.tokens == tokens
            return existing if same else None
        if block_id in self._by_block:
            raise RuntimeError(f"block {block_id} is registered already")
        entry = CachedBlock(key, tokens, parent, block_id, computed_by)
        self._by_hash[key] = entry
        self._by_block[block_id] = entry
        return entry

    def evict(self, block_id: int) -> None:
        """Forget the block's content: it is about to be overwritten."""
        entry = self._by_block.pop(block_id)
        del self._by_hash[entry.block_hash]
