"""The one entry point for int4 weight-only matrix products: which kernel, and its operands.

Checkpoints always hold AutoAWQ's layout (`kernels.int4_layout`). Each kernel says which
tensors it reads (its operands), how to make them from AutoAWQ's tensors once at load time,
and how to multiply; a layer holds only its kernel's operands, so memory and the weight bytes
a forward reads are those of the form actually served. The choice, made once per layer:

- `triton`: the Triton GEMM on CUDA (reads AutoAWQ's layout as is);
- `torch-packed`: torch's CPU int4 kernel after repacking, the fastest CPU path measured in
  bfloat16 (`benchmarks/bench_int4.py`; in float16 and float32 it is slower than the
  reference);
- `cpu-panels`: the compiled fp32 panel product on nibbles (`kernels/int4_matmul_cpu.py`),
  the CPU path in float32: bit for bit the dense fp32 layer of the dequantised weight, so the
  product is the quantised model's exact function (quality is measured in float32);
- `reference`: unpack, dequantise, multiply, in plain PyTorch (what the others are checked
  against, and the CPU path where no compiled build exists).

`auto` picks triton on CUDA, torch-packed on a CPU in bfloat16 where the shape allows,
cpu-panels on a CPU in float32 where the compiled operators are built, and the reference
otherwise; the other names force a kernel (the tests' switch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from servelab.base.errors import ConfigError
from servelab.kernels.cpu_build import cpu_ops
from servelab.kernels.int4_layout import PACK, num_groups
from servelab.kernels.int4_matmul_cpu import (
    PANEL_COLUMNS,
    cpu_group_size,
    cpu_packed_available,
    int4_matmul_cpu,
    to_cpu_packed,
    to_cpu_panels,
)
from servelab.kernels.int4_matmul_ref import int4_matmul_ref
from servelab.kernels.int4_matmul_triton import int4_matmul_triton, interpreted

IMPLS = ("auto", "triton", "torch-packed", "cpu-panels", "reference")
FIELD = "strategy.int4_kernel"

Operands = dict[str, torch.Tensor]
OperandShapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class Int4Kernel:
    """One way to multiply by an int4 weight of a given shape."""

    name: str
    in_features: int
    out_features: int
    group_size: int
    dtype: torch.dtype  # the activations' dtype (and of float operands)

    def operand_shapes(self) -> OperandShapes:
        """The tensors a layer stores for this kernel: name -> (shape, dtype)."""
        if self.name == "torch-packed":
            group = self.cpu_group()
            return {
                "packed": ((self.out_features, self.in_features // 2), torch.uint8),
                "scales_and_offsets": (
                    (self.in_features // group, self.out_features, 2),
                    self.dtype,
                ),
            }
        groups = num_groups(self.in_features, self.group_size)
        if self.name == "cpu-panels":
            panels = -(-self.out_features // PANEL_COLUMNS)
            per_group = ((panels, groups, PANEL_COLUMNS), torch.float32)
            return {
                "nibbles": ((panels, self.in_features, PANEL_COLUMNS // 2), torch.uint8),
                "zeros": per_group,
                "group_scales": per_group,
            }
        return {
            "qweight": ((self.in_features, self.out_features // PACK), torch.int32),
            "qzeros": ((groups, self.out_features // PACK), torch.int32),
            "scales": ((groups, self.out_features), self.dtype),
        }

    def from_awq(
        self, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor
    ) -> Operands:
        """This kernel's operands from AutoAWQ's tensors (done once, when a layer loads)."""
        if self.name == "torch-packed":
            packed, pairs = to_cpu_packed(qweight, qzeros, scales, self.group_size, self.dtype)
            return {"packed": packed, "scales_and_offsets": pairs}
        if self.name == "cpu-panels":
            nibbles, zeros, group_scales = to_cpu_panels(qweight, qzeros, scales)
            return {"nibbles": nibbles, "zeros": zeros, "group_scales": group_scales}
        return {"qweight": qweight, "qzeros": qzeros, "scales": scales.to(self.dtype)}

    def matmul(self, x: torch.Tensor, operands: Mapping[str, torch.Tensor | None]) -> torch.Tensor:
        """`x` `[M, in]` times the weight whose operands are `operands` (by name)."""
        get = operands.__getitem__
        if self.name == "torch-packed":
            return int4_matmul_cpu(x, get("packed"), get("scales_and_offsets"), self.cpu_group())
        if self.name == "cpu-panels":
            return cpu_ops().int4_panel_linear_f32(
                x,
                get("nibbles"),
                get("zeros"),
                get("group_scales"),
                self.group_size,
                self.out_features,
            )
        args = (x, get("qweight"), get("qzeros"), get("scales"), self.group_size)
        if self.name == "triton":
            return int4_matmul_triton(*args)
        return int4_matmul_ref(*args)

    def cpu_group(self) -> int:
        """The group torch's packed CPU kernel serves this shape with."""
        group = cpu_group_size(self.in_features, self.group_size)
        assert group is not None, "checked by choose_kernel"
        return group


def choose_kernel(
    impl: str,
    device: torch.device,
    dtype: torch.dtype,
    in_features: int,
    out_features: int,
    group_size: int,
) -> Int4Kernel:
    """The kernel for one layer's shape on `device` with activations in `dtype`."""
    if impl not in IMPLS:
        raise ConfigError(FIELD, f"{impl!r} is not one of: {', '.join(IMPLS)}")
    if out_features % PACK:
        raise ConfigError(
            "strategy.weights",
            f"int4 packing needs output sizes divisible by 8, not {out_features}",
        )
    packed_fits = (
        device.type == "cpu"
        and cpu_packed_available()
        and cpu_group_size(in_features, group_size) is not None
    )
    if impl == "auto":
        if device.type == "cuda":
            impl = "triton"
        elif packed_fits and dtype == torch.bfloat16:
            impl = "torch-packed"
        elif device.type == "cpu" and dtype == torch.float32 and cpu_ops() is not None:
            impl = "cpu-panels"
        else:
            impl = "reference"
    if impl == "torch-packed" and not packed_fits:
        raise ConfigError(
            FIELD,
            f"torch-packed needs a CPU, torch's int4 CPU kernel and a group of 32-256 dividing "
            f"in={in_features} (group_size={group_size}); use auto or reference",
        )
    if impl == "cpu-panels" and not (
        device.type == "cpu" and dtype == torch.float32 and cpu_ops() is not None
    ):
        raise ConfigError(
            FIELD,
            f"cpu-panels needs a CPU, float32 and the compiled CPU operators (got "
            f"{device.type}, {dtype}); use auto or reference",
        )
    if impl == "triton":
        _check_triton(device, dtype)
    return Int4Kernel(impl, in_features, out_features, group_size, dtype)


def _check_triton(device: torch.device, dtype: torch.dtype) -> None:
    if device.type == "cuda":
        return
    if not interpreted():
        raise ConfigError(
            FIELD,
            f"the Triton int4 kernel needs a CUDA device (got {device.type}); use auto, or set "
            "TRITON_INTERPRET=1 before triton is imported to run it in the interpreter",
        )
    if dtype == torch.bfloat16:
        raise ConfigError(
            FIELD, "the Triton interpreter computes bfloat16 wrongly; use float32 or float16"
        )
