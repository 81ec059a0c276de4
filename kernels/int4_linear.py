"""The linear layer of the int4 weight formats: AutoAWQ tensors in, its kernel's operands kept.

A checkpoint gives each quantised linear AutoAWQ's `qweight`, `qzeros` and `scales` (the same
names for checkpoints servelab writes and for published AWQ ones). While the state dict
loads, the layer converts them into the operands of the kernel chosen for it
(`kernels.int4_matmul`) and keeps only those, as buffers: one copy, in the form the forward
reads, so the default `weight_bytes` (every state-dict tensor) counts what is served. A dummy
shape, which has no checkpoint, draws random int4 weights into it (`draw_random`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from servelab.kernels.int4_layout import PACK, num_groups, pack_int4
from servelab.kernels.int4_matmul import Int4Kernel

AWQ_TENSORS = ("qweight", "qzeros", "scales")
DRAWN_ZERO = 8  # the zero point of drawn weights: values 1..15 stand for -7..7 steps
DRAWN_VARIANCE = sum((q - DRAWN_ZERO) ** 2 for q in range(1, 16)) / 15  # in steps squared


class Int4Linear(nn.Module):
    """`y = x @ W` (no bias) with `W` `[in, out]` int4, multiplied by its kernel."""

    def __init__(self, kernel: Int4Kernel) -> None:
        super().__init__()
        self.kernel = kernel
        self.in_features = kernel.in_features
        self.out_features = kernel.out_features
        for name, (shape, dtype) in kernel.operand_shapes().items():
            self.register_buffer(name, torch.empty(shape, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = self.kernel.matmul(rows, self._buffers)
        return out.view(*x.shape[:-1], self.out_features)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """The AutoAWQ tensor shapes a checkpoint must give this layer."""
        groups = num_groups(self.in_features, self.kernel.group_size)
        words = self.out_features // PACK
        return {
            "qweight": (self.in_features, words),
            "qzeros": (groups, words),
            "scales": (groups, self.out_features),
        }

    def draw_random(self, generator: torch.Generator, std: float) -> None:
        """Random weights for a dummy shape: each value uniform in 1..15 about a zero point of
        8 (mean zero), every group's scale set so that the weight's standard deviation is
        `std` (a dummy dense layer's); made on the layer's device, through the kernel's own
        conversion."""
        device = next(self.buffers()).device
        groups, outputs = num_groups(self.in_features, self.kernel.group_size), self.out_features
        values = torch.randint(
            1, 16, (self.in_features, outputs), generator=generator, device=device
        )
        zeros = torch.full((groups, outputs), DRAWN_ZERO, device=device)
        scale = std / DRAWN_VARIANCE**0.5
        scales = torch.full((groups, outputs), scale, dtype=torch.float16, device=device)
        self._convert({"qweight": pack_int4(values), "qzeros": pack_int4(zeros), "scales": scales})

    def _convert(self, awq: dict[str, torch.Tensor]) -> None:
        """Keep the kernel's operands made from AutoAWQ's tensors."""
        with torch.no_grad():
            for name, tensor in self.kernel.from_awq(**awq).items():
                self.get_buffer(name).copy_(tensor)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        del local_metadata, strict
        mine = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        unexpected_keys.extend(prefix + k for k in mine if k not in AWQ_TENSORS)
        absent = [name for name in AWQ_TENSORS if name not in mine]
        if absent:
            missing_keys.extend(prefix + name for name in absent)
            return
        for name, shape in self.expected_shapes().items():
            if tuple(mine[name].shape) != shape:
                error_msgs.append(
                    f"{prefix}{name}: shape {tuple(mine[name].shape)} in the checkpoint, "
                    f"{shape} expected (group size {self.kernel.group_size})"
                )
                return
        device = next(self.buffers()).device
        self._convert({name: mine[name].to(device) for name in AWQ_TENSORS})

    def extra_repr(self) -> str:
        return (
            f"in={self.in_features}, out={self.out_features}, "
            f"group={self.kernel.group_size}, kernel={self.kernel.name}"
        )
