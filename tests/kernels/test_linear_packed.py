"""Linear layers in bfloat16 at every ISA level: where oneDNN multiplies bfloat16 the prepacked
layer gives exactly the plain layer's outputs and follows weight changes, a few rows go
through the compiled matrix-vector operator instead, and where oneDNN does not (AVX2, the
portable levels) every row count goes through that operator: the product of the same operands,
and never a oneDNN error. In fp32 every row count multiplies on the weight packed into panels,
each output summed in one order whatever the rows beside it or the thread count."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from servelab.kernels.capabilities import capabilities
from servelab.kernels.linear import MATVEC_ROWS, PackedLinear, pack_ahead
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


def test_fp16_runs_the_plain_layer() -> None:
    layer = PackedLinear(32, 16).to(torch.float16)
    x = torch.randn(3, 32, dtype=torch.float16)
    assert torch.equal(layer(x), F.linear(x, layer.weight)) and layer._packed is None


def test_fp32_panels_hold_the_weight_sixteen_columns_at_a_time(cpu_build: CpuBuild) -> None:
    weight = torch.randn(41, 7)
    panels = cpu_build.ops.pack_panels_f32(weight)
    assert panels.shape == (3, 7, 16)  # ceil(41 / 16) panels, a line of 16 columns per input
    padded = torch.cat([weight, torch.zeros(48 - 41, 7)])
    assert torch.equal(panels, padded.view(3, 16, 7).transpose(1, 2))


@pytest.mark.parametrize("k_len", [576, 37])
def test_fp32_layers_multiply_on_the_packed_panels_at_every_row_count(
    cpu_build: CpuBuild, k_len: int
) -> None:
    torch.manual_seed(k_len)
    layer = PackedLinear(k_len, 41)
    panels = cpu_build.ops.pack_panels_f32(layer.weight)
    for rows in (1, 5, 6, 7, 64):
        x = torch.randn(rows, k_len)
        got = layer(x)
        assert torch.equal(got, cpu_build.ops.panel_linear_f32(x, panels, 41))
        torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert torch.equal(layer._packed, panels)


def test_the_fp32_product_does_not_depend_on_the_rows_beside_or_the_threads(
    cpu_build: CpuBuild,
) -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(300, 200, generator=generator)  # more rows than one block of x (256 KiB)
    panels = cpu_build.ops.pack_panels_f32(torch.randn(33, 200, generator=generator))
    whole = cpu_build.ops.panel_linear_f32(x, panels, 33)
    for first, count in ((0, 1), (3, 2), (5, 6), (10, 1), (7, 293)):
        part = cpu_build.ops.panel_linear_f32(x[first : first + count], panels, 33)
        assert torch.equal(part, whole[first : first + count])
    torch.set_num_threads(2)  # restored by one_torch_thread
    assert torch.equal(cpu_build.ops.panel_linear_f32(x, panels, 33), whole)


def test_an_edited_fp32_weight_is_packed_again(cpu_build: CpuBuild) -> None:
    layer = PackedLinear(32, 16)
    x = torch.randn(3, 32)
    layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    layer.weight = torch.nn.Parameter(torch.randn(16, 32))
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)


def test_a_packed_fp32_weight_of_another_shape_is_refused(cpu_build: CpuBuild) -> None:
    panels = cpu_build.ops.pack_panels_f32(torch.randn(16, 32))
    with pytest.raises(RuntimeError, match="pack_panels_f32"):
        cpu_build.ops.panel_linear_f32(torch.randn(2, 31), panels, 16)


def test_disabled_runs_the_plain_layer(cpu_build: CpuBuild) -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    layer.enabled = False
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is None


def test_pack_ahead_packs_what_a_forward_would_and_nothing_else(cpu_build: CpuBuild) -> None:
    model = torch.nn.Sequential(PackedLinear(32, 16), PackedLinear(16, 8).to(torch.bfloat16))
    model.append(PackedLinear(8, 4).to(torch.float16))
    pack_ahead(model)
    fp32, bf16, fp16 = model
    assert torch.equal(fp32._packed, cpu_build.ops.pack_panels_f32(fp32.weight))
    assert (bf16._packed is not None) == capabilities().onednn_bf16
    assert fp16._packed is None
    packed = fp32._packed
    x = torch.randn(3, 32)
    assert torch.equal(fp32(x), cpu_build.ops.panel_linear_f32(x, packed, 16))
    assert fp32._packed is packed  # the forward used the copy packed ahead
