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


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 `[rows, cols / 8]` in AWQ order -> uint8 `[rows, cols]` values in 0..15."""
    rows, words = packed.shape
    shifts = torch.tensor([4 * n for n in NIBBLE_OF_CHANNEL], device=packed.device)
    values = (packed.unsqueeze(-1) >> shifts) & 0xF
    return values.view(rows, words * PACK).to(torch.uint8)


def dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The weight `W` `[in, out]` the three tensors stand for, in `dtype`."""
    in_features = qweight.shape[0]
    q = unpack_int4(qweight).to(torch.float32)
    zeros = unpack_int4(qzeros).to(torch.float32)
    per_row = torch.arange(in_features, device=qweight.device) // group_size
    weight = (q - zeros[per_row]) * scales.to(torch.float32)[per_row]
    return weight.to(dtype)
