"""Prepacked linears give exactly the plain layer's outputs, and follow weight changes; a few
rows go through the matrix-vector operator instead, the product of the same operands."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu_attention import build_status
from kernels.linear import MATVEC_ROWS, PackedLinear, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="oneDNN packing unavailable")


@pytest.mark.parametrize("rows", [3, 7, 64])
def test_packed_bfloat16_equals_plain(rows: int) -> None:
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None  # the packed path ran


@pytest.mark.skipif(build_status() is not None, reason="no C++ compiler")
@pytest.mark.parametrize("rows", range(1, MATVEC_ROWS + 1))
def test_few_rows_take_the_matrix_vector_operator(rows: int) -> None:
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    out = layer(x)
    assert layer._packed is None  # oneDNN never ran
    exact = x.float() @ layer.weight.float().t()
    torch.testing.assert_close(out.float(), exact, rtol=2**-8, atol=1e-3)


def test_a_replaced_or_edited_weight_is_packed_again() -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    layer.weight = torch.nn.Parameter(torch.randn(16, 32, dtype=torch.bfloat16))
    assert torch.equal(layer(x), F.linear(x, layer.weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_run_the_plain_layer(dtype: torch.dtype) -> None:
    layer = PackedLinear(32, 16).to(dtype)
    x = torch.randn(3, 32, dtype=dtype)
    assert torch.equal(layer(x), F.linear(x, layer.weight)) and layer._packed is None


def test_disabled_runs_the_plain_layer() -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    layer.enabled = False
    layer(torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16))
    assert layer._packed is None
