"""Prepacked linears give exactly the plain layer's outputs, and follow weight changes; a few
rows go through the matrix-vector operator instead, and up to PANEL_ROWS rows (where built)
through the panel products, each the product of the same operands."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu_attention import build_status
from kernels.linear import (
    MATVEC_ROWS,
    PANEL_ROWS,
    PackedLinear,
    packing_available,
    panels_available,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="oneDNN packing unavailable")
ONEDNN_ROWS = PANEL_ROWS + 1  # rows that reach oneDNN whether or not panels are built


@pytest.mark.parametrize("rows", [ONEDNN_ROWS, 2 * PANEL_ROWS])
def test_packed_bfloat16_equals_plain(rows: int) -> None:
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is not None  # the packed path ran


@pytest.mark.skipif(build_status() is not None, reason="no C++ compiler")
@pytest.mark.parametrize("rows", range(1, MATVEC_ROWS + 1))
def test_few_rows_take_the_matrix_vector_operator(rows: int) -> None:
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    out = layer(x)
    assert layer._packed is None and layer._panels is None  # neither copy was made
    exact = x.float() @ layer.weight.float().t()
    torch.testing.assert_close(out.float(), exact, rtol=2**-8, atol=1e-3)


@pytest.mark.skipif(not panels_available(), reason="no panel products in this build")
@pytest.mark.parametrize("rows", [MATVEC_ROWS + 1, 64, PANEL_ROWS])
def test_up_to_panel_rows_take_the_panel_products(rows: int) -> None:
    torch.manual_seed(rows)
    layer = PackedLinear(96, 40).to(torch.bfloat16)
    x = torch.randn(1, rows, 96, dtype=torch.bfloat16)
    out = layer(x)
    assert out.shape == (1, rows, 40) and layer._packed is None  # oneDNN never ran
    panels = torch.ops.servelab.pack_panels(layer.weight.detach())
    assert torch.equal(layer.panel_weight(), panels)
    assert torch.equal(out[0], torch.ops.servelab.panel_linear(x[0], panels, 40))


@pytest.mark.parametrize("rows", [MATVEC_ROWS + 1, ONEDNN_ROWS])
def test_a_replaced_or_edited_weight_is_packed_again(rows: int) -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    x = torch.randn(rows, 32, dtype=torch.bfloat16)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    exact = x.float() @ layer.weight.float().t()
    torch.testing.assert_close(layer(x).float(), exact, rtol=2**-8, atol=1e-3)
    layer.weight = torch.nn.Parameter(torch.randn(16, 32, dtype=torch.bfloat16))
    exact = x.float() @ layer.weight.float().t()
    torch.testing.assert_close(layer(x).float(), exact, rtol=2**-8, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_other_dtypes_run_the_plain_layer(dtype: torch.dtype) -> None:
    layer = PackedLinear(32, 16).to(dtype)
    x = torch.randn(3, 32, dtype=dtype)
    assert torch.equal(layer(x), F.linear(x, layer.weight)) and layer._packed is None


def test_disabled_runs_the_plain_layer() -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    layer.enabled = False
    layer(torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16))
    assert layer._packed is None and layer._panels is None
