"""Linear layers on the fastest CPU paths: a matrix-vector loop for few rows, else oneDNN prepacked.

A plain `F.linear` on the CPU hands oneDNN a row-major weight that it reorders into its own
blocked layout on every call; for the small batches of decoding that reorder costs as much
as the product itself (measured on the development CPU, bfloat16, one thread: a
1 x 576 x 1536 product in 91 us plain, 44 us prepacked; 64 rows 623 us and 565 us), and the
outputs are bit-identical. `PackedLinear` is an `nn.Linear` (same parameter, same state dict)
that packs its weight once, on its first CPU forward in bfloat16, and packs again only if the
weight is replaced. fp32 stays off oneDNN's packed kernels (it is the mode exactness checks
run in, and they round differently from the plain ones for some batch sizes): up to a few
rows it takes the compiled `linear_f32` (`kernels/cpu/linear_f32.cpp`), whose sums do not
depend on the row count, beyond them the plain layer. Anywhere else (CUDA, fp16,
`enabled=False`) it is the plain layer too.

oneDNN prepacks bfloat16 only where it multiplies it (`Capabilities.onednn_bf16`: AVX-512
and its bf16 support, within the ISA level). Elsewhere (AVX2, the portable level) a bfloat16
layer takes the compiled matrix-vector loop for every row count: torch's own bfloat16 product
there widens element by element (0.3 GFLOP/s measured on an AVX2-only Zen 3) and the loop,
which widens a vector at a time, is the faster of the two; fp32 is the dtype such CPUs are
meant to run (`engine.dtype=auto`).

For at most `MATVEC_ROWS` rows (decode steps of few sequences) oneDNN reads the weight at
about half the memory bandwidth a plain sum reaches; there the layer calls the compiled
`matvec` (`kernels/cpu/matvec.cpp`, the loop the fused decoder layer uses), which streams each
weight row once for all rows (measured on the development CPU, two threads: a 49152 x 576
weight at 32 GB/s against oneDNN's 18). Its sums run in another order than oneDNN's, so those
outputs differ from the plain layer's by bfloat16 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.capabilities import capabilities
from kernels.cpu_build import cpu_ops

PACKED_DTYPES = (torch.bfloat16,)
MATVEC_ROWS = 4
# fp32 rows up to which the compiled `linear_f32` beats torch's product (MKL), measured on an
# AVX2-only Zen 3 (`python -m benchmarks.bench_linear_f32 --threads N`): the decoder's
# projections up to 8 rows on one thread (1.4-2.7x; 0.75-0.95x at 16-32), up to 32 on two
# (1.07-2.9x; 0.87-0.95x at 64, where MKL's blocked kernels scale better); the LM head (a
# 49152 x 576 weight, read from memory) up to 64 either way (1.05-2.8x).
F32_ROWS_ONE_THREAD = 8
F32_ROWS = 32
F32_LM_HEAD_ROWS = 64


def f32_row_limit(lm_head: bool) -> int:
    """The fp32 rows up to which a layer takes `linear_f32`, for this many torch threads."""
    if lm_head:
        return F32_LM_HEAD_ROWS
    return F32_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else F32_ROWS


class PackedLinear(nn.Linear):
    """`nn.Linear` whose CPU forward runs on a oneDNN-prepacked copy of its weight."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = False, lm_head: bool = False
    ) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.enabled = True
        self.lm_head = lm_head  # its fp32 rows take `linear_f32` up to F32_LM_HEAD_ROWS
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple[int, int] | None = None  # (data_ptr, version) packed

    def _usable(self, x: torch.Tensor) -> bool:
        """Whether this forward may take a compiled path: on the CPU, not disabled."""
        weight = self.weight
        return (
            self.enabled
            and self.bias is None
            and x.device.type == "cpu"
            and weight.device.type == "cpu"
            and x.dtype == weight.dtype
        )

    def packed_weight(self) -> torch.Tensor:
        """oneDNN's prepacked copy of the weight, packed again if the weight was replaced."""
        source = (self.weight.data_ptr(), self.weight._version)
        if self._packed is None or self._packed_from != source:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
            self._packed_from = source
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._usable(x):
            return F.linear(x, self.weight, self.bias)
        if x.dtype == torch.float32:
            return self._forward_f32(x)
        if x.dtype not in PACKED_DTYPES:
            return F.linear(x, self.weight, self.bias)
        ops = cpu_ops()
        onednn = capabilities().onednn_bf16
        if ops is None and not onednn:
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        if ops is not None and (rows.shape[0] <= MATVEC_ROWS or not onednn):
            out = ops.matvec(rows, self.weight)
        else:
            out = torch.ops.mkldnn._linear_pointwise(
                rows, self.packed_weight(), self.bias, "none", [], ""
            )
        return out.view(*x.shape[:-1], self.out_features)

    def _forward_f32(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ops = cpu_ops() if rows.shape[0] <= f32_row_limit(self.lm_head) else None
        if ops is None:
            return F.linear(x, self.weight)
        return ops.linear_f32(rows, self.weight).view(*x.shape[:-1], self.out_features)


def packed_linear(in_features: int, out_features: int, name: str) -> nn.Module:
    """The linear factory for dense weights: a layer that prepacks on the CPU."""
    return PackedLinear(in_features, out_features, lm_head=name == "lm_head")
