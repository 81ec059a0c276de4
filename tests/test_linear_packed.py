"""Linear layers in bfloat16 at every ISA level: where oneDNN multiplies bfloat16 the prepacked
layer gives exactly the plain layer's outputs and follows weight changes, a few rows go
through the compiled matrix-vector operator instead, and where oneDNN does not (AVX2, the
portable levels) every row count goes through that operator: the product of the same operands,
and never a oneDNN error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.capabilities import capabilities
from kernels.linear import MATVEC_ROWS, PackedLinear
from tests.conftest import CpuBuild


def _exact(layer: PackedLinear, x: torch.Tensor) -> torch.Tensor:
    return x.float() @ layer.weight.float().t()


def _needs_onednn_bf16() -> None:
    if not capabilities().onednn_bf16:
        pytest.skip(f"oneDNN does not multiply bfloat16 at {capabilities().level}")


@pytest.mark.parametrize("rows", [3, 7, 64])
def test_packed_bfloat16_equals_plain(cpu_build: CpuBuild, rows: int) -> None:
    _needs_onednn_bf16()
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None  # the packed path ran


@pytest.mark.parametrize("rows", [*range(1, MATVEC_ROWS + 1), 64])
def test_rows_oneDNN_does_not_take_go_through_the_matrix_vector_operator(
    cpu_build: CpuBuild, rows: int
) -> None:
    if rows > MATVEC_ROWS and capabilities().onednn_bf16:
        pytest.skip("oneDNN multiplies bfloat16 here: more rows take its prepacked product")
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    out = layer(x)
    assert layer._packed is None  # oneDNN never ran
    torch.testing.assert_close(out.float(), _exact(layer, x), rtol=2**-8, atol=1e-3)


def test_a_replaced_or_edited_weight_is_packed_again(cpu_build: CpuBuild) -> None:
    _needs_onednn_bf16()
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    layer.weight = torch.nn.Parameter(torch.randn(16, 32, dtype=torch.bfloat16))
    assert torch.equal(layer(x), F.linear(x, layer.weight))


def test_without_onednn_bf16_an_edited_weight_is_read_as_it_is_now(cpu_build: CpuBuild) -> None:
    if capabilities().onednn_bf16:
        pytest.skip("oneDNN multiplies bfloat16 here")
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    torch.testing.assert_close(layer(x).float(), _exact(layer, x), rtol=2**-8, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_run_the_plain_layer(dtype: torch.dtype) -> None:
    layer = PackedLinear(32, 16).to(dtype)
    x = torch.randn(3, 32, dtype=dtype)
    assert torch.equal(layer(x), F.linear(x, layer.weight)) and layer._packed is None


def test_disabled_runs_the_plain_layer(cpu_build: CpuBuild) -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    layer.enabled = False
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is None
