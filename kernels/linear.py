"""Linear layers on the fastest CPU paths: fp32 on packed panels; bf16 oneDNN-prepacked or a matvec.

A plain `F.linear` on the CPU hands oneDNN a row-major weight that it reorders into its own
blocked layout on every call; for the small batches of decoding that reorder costs about as much
as the product itself, and the outputs are bit-identical. `PackedLinear` is an `nn.Linear` (same
parameter, same state dict) that packs its weight once, on its first CPU forward in bfloat16,
and packs again only if the weight is replaced. fp32 layers multiply, at every row count, on a
copy of the weight packed once into 16-column panels (`kernels/cpu/panel_gemm_f32.cpp`): each
output is one sum over the inputs in order, so a row's result does not depend on the batch it is
in, the thread count or the build's ISA branch (exactness checks run in fp32), and the product
outran torch's (MKL) at every row count and for the LM head where it was timed (`python -m
benchmarks.bench_linear_f32 --threads 2` times both). Anywhere else (CUDA, fp16,
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

from servelab.kernels.capabilities import capabilities
from servelab.kernels.cpu_build import cpu_ops

PACKED_DTYPES = (torch.bfloat16,)
MATVEC_ROWS = 4


class PackedLinear(nn.Linear):
    """`nn.Linear` whose CPU forward runs on a packed copy of its weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.enabled = True
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
        """The packed copy of the weight (oneDNN's for bfloat16, the compiled panels for fp32),
        packed again if the weight was replaced or edited."""
        source = (self.weight.data_ptr(), self.weight._version)
        if self._packed is None or self._packed_from != source:
            weight = self.weight.detach()
            if weight.dtype == torch.float32:
                self._packed = cpu_ops().pack_panels_f32(weight)
            else:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            self._packed_from = source
        return self._packed

    def pack_ahead(self) -> None:
        """Pack now, when the model loads, where a forward would pack: so the first step served
        does not pay for it (about 0.3 s for the fp32 panels of a 135M model, which landed in
        the first request's TTFT and queued every request that arrived meanwhile)."""
        weight = self.weight
        if not self.enabled or self.bias is not None or weight.device.type != "cpu":
            return
        panels = weight.dtype == torch.float32 and cpu_ops() is not None
        onednn = weight.dtype in PACKED_DTYPES and capabilities().onednn_bf16
        if panels or onednn:
            self.packed_weight()

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
        ops = cpu_ops()
        if ops is None:
            return F.linear(x, self.weight)
        rows = x.reshape(-1, x.shape[-1])
        out = ops.panel_linear_f32(rows, self.packed_weight(), self.out_features)
        return out.view(*x.shape[:-1], self.out_features)


def pack_ahead(model: nn.Module) -> None:
    """Packs every `PackedLinear` of `model` that a CPU forward would pack (see `pack_ahead`)."""
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.pack_ahead()


def packed_linear(in_features: int, out_features: int, name: str) -> nn.Module:
    """The linear factory for dense weights: a layer that prepacks on the CPU."""
    return PackedLinear(in_features, out_features)
