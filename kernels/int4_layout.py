"""AutoAWQ's GEMM layout for int4 weights: packing, unpacking and dequantising.

A linear `y = x @ W` with `W` `[in, out]` is stored as three tensors:

- `qweight` int32 `[in, out / 8]`: eight 4-bit values per word, the output channels of each
  run of eight stored in the nibble order `AWQ_ORDER` (nibble `i`, bits `4i .. 4i + 3`, holds
  channel `AWQ_ORDER[i]` of the eight);
- `qzeros` int32 `[groups, out / 8]`: the integer zero point of each group, packed the same way;
- `scales` float16 `[groups, out]`.

Groups run along the input dimension: input row `k` belongs to group `k // group_size`, and
`W[k, n] = (q[k, n] - zero[k // group_size, n]) * scale[k // group_size, n]`. Where
`group_size` does not divide `in`, the last group is shorter (`groups = ceil(in / group_size)`);
AutoAWQ's own kernels need `in % group_size == 0`, so such files are a servelab extension.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds channel AWQ_ORDER[i] of each eight
# the nibble that holds channel c: the inverse permutation
NIBBLE_OF_CHANNEL = tuple(AWQ_ORDER.index(c) for c in range(8))
PACK = 8  # 4-bit values per int32


def num_groups(in_features: int, group_size: int) -> int:
    """Groups along an input dimension of `in_features` (the last one may be shorter)."""
    return -(-in_features // group_size)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """`values` `[rows, cols]` integers in 0..15 -> int32 `[rows, cols / 8]` in AWQ order."""
    rows, cols = values.shape
    if cols % PACK:
        raise ValueError(f"{cols} columns is not a multiple of {PACK}")
    grouped = values.to(torch.int64).view(rows, cols // PACK, PACK)
    packed = torch.zeros(rows, cols // PACK, dtype=torch.int64, device=values.device)
    for nibble, channel in enumerate(AWQ_ORDER):
        packed |= grouped[:, :, channel] << (4 * nibble)
    # the words are 32 bits: reinterpret the top bit as the sign, as int32 storage does
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int32 `[rows, cols / 8]` -> int32 `[rows, cols]`, channels in order."""
    shifts = torch.tensor([4 * n for n in NIBBLE_OF_CHANNEL], device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts.to(packed.dtype)) & 0xF).view(packed.shape[0], -1)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 `[rows, cols / 8]` in AWQ order -> uint8 `[rows, cols]` values in 0..15."""
    return _nibbles(packed).to(torch.uint8)


def dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The weight `W` `[in, out]` the three tensors stand for, in `dtype`.

    Computed in float32 as `q * scale - zero * scale`, group by group without expanding the
    scales to every row; each product is exact in float32, so this equals
    `(q - zero) * scale`."""
    in_features = qweight.shape[0]
    values = _nibbles(qweight).to(torch.float32)
    step = scales.to(torch.float32)
    offset = _nibbles(qzeros).to(torch.float32) * step
    full = in_features // group_size
    rows = full * group_size
    head = (
        values[:rows]
        .view(full, group_size, values.shape[1])
        .mul_(step[:full, None])
        .sub_(offset[:full, None])
    )
    weight = head.view(rows, values.shape[1])
    if rows < in_features:
        tail = values[rows:].mul_(step[full]).sub_(offset[full])
        weight = torch.cat((weight, tail))
    return weight.to(dtype)
