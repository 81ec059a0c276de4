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
from kernels.linear import (
    F32_LM_HEAD_ROWS,
    F32_ROWS,
    F32_ROWS_ONE_THREAD,
    MATVEC_ROWS,
    PackedLinear,
    f32_row_limit,
    packed_linear,
)
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


@pytest.mark.parametrize("k_len", [576, 37])
def test_fp32_rows_up_to_the_limit_take_the_compiled_product(cpu_build: CpuBuild, k_len) -> None:
    torch.manual_seed(k_len)
    layer = PackedLinear(k_len, 41)
    limit = f32_row_limit(lm_head=False)  # tests run one torch thread
    assert limit == F32_ROWS_ONE_THREAD
    for rows in (1, 3, limit):
        x = torch.randn(rows, k_len)
        got = layer(x)
        assert torch.equal(got, cpu_build.ops.linear_f32(x, layer.weight))
        torch.testing.assert_close(got, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    beyond = torch.randn(limit + 1, k_len)
    assert torch.equal(layer(beyond), F.linear(beyond, layer.weight))


def test_the_compiled_fp32_product_does_not_depend_on_the_rows_beside(cpu_build) -> None:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(11, 200, generator=generator)
    w = torch.randn(33, 200, generator=generator)
    whole = cpu_build.ops.linear_f32(x, w)
    for first, count in ((0, 1), (3, 2), (5, 6), (10, 1)):
        part = cpu_build.ops.linear_f32(x[first : first + count], w)
        assert torch.equal(part, whole[first : first + count])


def test_the_lm_head_takes_the_compiled_fp32_product_for_more_rows(cpu_build: CpuBuild) -> None:
    head, up = packed_linear(576, 300, "lm_head"), packed_linear(576, 300, "layers.0.mlp.up_proj")
    x = torch.randn(F32_LM_HEAD_ROWS, 576)
    assert torch.equal(head(x), cpu_build.ops.linear_f32(x, head.weight))
    assert torch.equal(up(x), F.linear(x, up.weight))
    torch.set_num_threads(2)  # more threads: MKL wins later (restored by one_torch_thread)
    assert f32_row_limit(lm_head=False) == F32_ROWS


def test_disabled_runs_the_plain_layer(cpu_build: CpuBuild) -> None:
    layer = PackedLinear(32, 16).to(torch.bfloat16)
    layer.enabled = False
    x = torch.randn(MATVEC_ROWS + 1, 32, dtype=torch.bfloat16)
    assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert layer._packed is None
