"""The int4 weight-only product on the embedded model's feed-forward shape (576 -> 1,536, group
128): torch's packed CPU kernel in bfloat16 (what `auto` serves on a CPU in bfloat16), the fp32
panels (what `auto` serves in float32, where quality is measured) and the unpack-then-multiply
reference in float32, at batch 1 (decode of one request) and 32 (a decode step of many), beside
the dense bfloat16 layer they replace (the engine's prepacked linear)."""

from __future__ import annotations

import pytest
import torch

from servelab.kernels.int4_layout import dequantize, num_groups, pack_int4
from servelab.kernels.int4_matmul import choose_kernel
from servelab.kernels.linear import PackedLinear

IN, OUT, GROUP = 576, 1536, 128
CPU = torch.device("cpu")
KERNELS = {"torch-packed": torch.bfloat16, "cpu-panels": torch.float32, "reference": torch.float32}


def _awq_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    groups = num_groups(IN, GROUP)
    qweight = pack_int4(torch.randint(0, 16, (IN, OUT), generator=generator))
    qzeros = pack_int4(torch.randint(0, 16, (groups, OUT), generator=generator))
    scales = torch.rand(groups, OUT, generator=generator) * 0.02 + 0.001
    return qweight, qzeros, scales


@pytest.mark.parametrize("rows", [1, 32])
@pytest.mark.parametrize("impl", list(KERNELS))
def test_int4_matmul(benchmark, impl: str, rows: int) -> None:
    dtype = KERNELS[impl]
    qweight, qzeros, scales = _awq_tensors()
    kernel = choose_kernel(impl, CPU, dtype, IN, OUT, GROUP)
    operands = kernel.from_awq(qweight, qzeros, scales)
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(1)).to(dtype)
    benchmark.group = f"int4 matmul {IN}x{OUT}, batch {rows}"
    out = benchmark(kernel.matmul, x, operands)
    expected = x.float() @ dequantize(qweight, qzeros, scales, GROUP)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("rows", [1, 32])
def test_dense_bf16_matmul_it_replaces(benchmark, rows: int) -> None:
    qweight, qzeros, scales = _awq_tensors()
    layer = PackedLinear(IN, OUT).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(dequantize(qweight, qzeros, scales, GROUP).t())
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    benchmark.group = f"int4 matmul {IN}x{OUT}, batch {rows}"
    with torch.no_grad():
        out = benchmark(layer, x)
    assert out.shape == (rows, OUT)
