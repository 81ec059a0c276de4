"""The KV cache tensors and the arithmetic of what one token costs to store.

Both KV strategies store keys and values in the same layout (see `base.batch`): per
layer, `[num_blocks, block_size, stored_kv_heads, head_dim]`. What differs between them is
only how slots are handed out, which the KV managers in `strategies/kv` decide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from servelab.base.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}


def parse_bytes(value: str | int | float, field: str = "engine.kv_budget") -> int:
    """`268435456`, `256MiB`, `1.5GB` -> bytes."""
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            fraction = " or 0.9" if field == "engine.kv_budget" else ""
            raise ConfigError(field, f"{value!r} is not a size; write e.g. 256MiB, 2GB{fraction}")
        number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise ConfigError(field, f"{value!r} must be positive")
    return int(number * _UNITS[unit])


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    stored_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of one token across every layer."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.stored_kv_heads * self.head_dim * element


@dataclass
class KVCache:
    layout: KVLayout
    num_blocks: int
    block_size: int
    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def allocate_kv_cache(
    layout: KVLayout, budget_bytes: int, block_size: int, device: torch.device
) -> KVCache:
    """As many whole blocks as fit in the budget, zero-filled."""
    num_blocks = budget_bytes // (layout.bytes_per_token * block_size)
    if num_blocks < 1:
        raise ConfigError(
            "engine.kv_budget",
            f"{budget_bytes} bytes hold no block of {block_size} tokens "
            f"({layout.bytes_per_token} bytes per token); raise the budget",
        )
    shape = (num_blocks, block_size, layout.stored_kv_heads, layout.head_dim)
    return KVCache(
        layout=layout,
        num_blocks=num_blocks,
        block_size=block_size,
        k=[torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)],
        v=[torch.zeros(shape, dtype=layout.dtype, device=device) for _ in range(layout.num_layers)],
    )
