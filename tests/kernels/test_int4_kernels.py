"""Int4 matrix products: AutoAWQ's nibble order, the Triton kernel (interpreted), torch's CPU
kernel and the fp32 panels against the unpack-then-matmul reference, and the kernel choice."""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.harness.checks.launches import on_triton_launch
from servelab.kernels.cpu_build import cpu_ops
from servelab.kernels.int4_layout import num_groups, pack_int4, unpack_int4
from servelab.kernels.int4_matmul import choose_kernel
from servelab.kernels.int4_matmul_cpu import (
    int4_loop_block,
    int4_matmul_cpu,
    to_cpu_packed,
    to_cpu_panels,
)
from servelab.kernels.int4_matmul_ref import int4_matmul_ref
from servelab.kernels.int4_matmul_triton import (
    GEMV_ROWS,
    Tiles,
    int4_gemm_triton,
    int4_gemv_triton,
    int4_matmul_triton,
    interpreted,
)

CPU = torch.device("cpu")
# the Triton kernel runs compiled where CUDA is (scripts/gpu_check.sh), else interpreted
KERNEL_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def random_int4(in_features: int, out_features: int, group: int, seed: int):
    """Fresh random packed tensors and the weight `[in, out]` they stand for, dequantised here
    without the layout module (each value from its own nibble, by the format's order)."""
    generator = torch.Generator().manual_seed(seed)
    groups = num_groups(in_features, group)
    values = torch.randint(0, 16, (in_features, out_features), generator=generator)
    zeros = torch.randint(0, 16, (groups, out_features), generator=generator)
    scales = (torch.rand(groups, out_features, generator=generator) * 0.02 + 0.001).half()
    rows = torch.arange(in_features) // group
    weight = (values - zeros[rows]).float() * scales.float()[rows]
    return pack_int4(values), pack_int4(zeros), scales, weight


def test_nibble_order_is_autoawqs():
    # channels 0..7 with values 1..8: AutoAWQ puts channel order[i] in nibble i, order
    # 0 2 4 6 1 3 5 7, so the word reads (nibble 7 first) 8 6 4 2 7 5 3 1 in hex
    packed = pack_int4(torch.arange(1, 9).view(1, 8))
    assert packed.item() == 0x86427531 - (1 << 32)  # int32: the top bit is the sign
    assert unpack_int4(packed).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]


def test_pack_unpack_round_trip():
    values = torch.randint(0, 16, (5, 24), generator=torch.Generator().manual_seed(1))
    assert torch.equal(unpack_int4(pack_int4(values)).long(), values)


def test_reference_matches_the_weight_it_stands_for():
    qweight, qzeros, scales, weight = random_int4(200, 72, 64, seed=2)
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(int4_matmul_ref(x, qweight, qzeros, scales, 64), x @ weight)


@pytest.mark.parametrize(
    ("rows", "in_features", "out_features", "group"),
    [(1, 200, 72, 64), (7, 576, 192, 128), (33, 130, 24, 32), (64, 64, 8, 128), (256, 96, 136, 32)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_matches_reference(rows, in_features, out_features, group, dtype):
    qweight, qzeros, scales, _ = random_int4(in_features, out_features, group, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(4)).to(dtype)
    expected = int4_matmul_ref(x.float(), qweight, qzeros, scales, group)
    on = [t.to(KERNEL_DEVICE) for t in (x, qweight, qzeros, scales)]
    got = int4_matmul_triton(*on, group).cpu()
    assert got.dtype == dtype and got.shape == (rows, out_features)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    ("product", "rows", "in_features", "out_features", "group", "splits"),
    [
        (int4_gemv_triton, 1, 576, 576, 128, None),  # as many slices as fill the GPU
        (int4_gemv_triton, 2, 200, 72, 64, 1),  # a short last group; columns not 64 a tile
        (int4_gemv_triton, 5, 130, 24, 32, 3),  # inputs not a multiple of the 32-row step
        (int4_gemv_triton, 8, 1536, 192, 128, 48),  # one slice per step
        (int4_gemv_triton, 3, 144, 40, 48, 2),  # a step across two groups
        (int4_gemm_triton, 9, 576, 192, 128, None),  # as many slices as fill the GPU
        (int4_gemm_triton, 16, 200, 72, 64, 1),  # one slice, written directly
        (int4_gemm_triton, 33, 130, 24, 32, 2),  # inputs not a multiple of the 64-row step
        (int4_gemm_triton, 64, 1536, 136, 128, 24),  # one slice per step; a partial tile
        (int4_gemm_triton, 20, 288, 64, 96, 2),  # a step across two groups
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_k_products_match_reference(
    product, rows, in_features, out_features, group, splits, dtype
):
    qweight, qzeros, scales, _ = random_int4(in_features, out_features, group, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(5)).to(dtype)
    expected = int4_matmul_ref(x.float(), qweight, qzeros, scales, group)
    on = [t.to(KERNEL_DEVICE) for t in (x, qweight, qzeros, scales)]
    got = product(*on, group, splits).cpu()
    assert got.dtype == dtype and got.shape == (rows, out_features)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("tiles", [Tiles(16, 16, 1), Tiles(128, 64, 8), Tiles(32, 128, 2)])
@pytest.mark.parametrize(("product", "rows", "splits"),
                         [(int4_gemv_triton, 3, 2), (int4_gemm_triton, 24, 1),
                          (int4_gemm_triton, 40, 3)])  # fmt: skip
def test_every_tiling_gives_the_reference(product, rows, splits, tiles):
    """Output tiles wider and narrower than the layer's last partial one, steps within a
    group of 64 and across two, in one slice and in several."""
    qweight, qzeros, scales, _ = random_int4(320, 200, 64, seed=rows)
    x = torch.randn(rows, 320, generator=torch.Generator().manual_seed(9)).half()
    expected = int4_matmul_ref(x.float(), qweight, qzeros, scales, 64)
    on = [t.to(KERNEL_DEVICE) for t in (x, qweight, qzeros, scales)]
    launched: list[dict] = []
    with on_triton_launch(lambda kernel, args, kwargs: launched.append(kwargs)):
        got = product(*on, 64, splits, tiles).cpu()
    torch.testing.assert_close(got.float(), expected, atol=2e-2, rtol=2e-2)
    if interpreted():  # the launch as the interpreter sees it: with the tiles asked for
        (sizes,) = launched
        assert (sizes["BLOCK_N"], sizes["BLOCK_K"], sizes["num_warps"]) == (
            tiles.block_n, tiles.block_k, tiles.num_warps
        )  # fmt: skip


@pytest.mark.parametrize("rows", [3, GEMV_ROWS + 4])
def test_the_benchmarks_tiled_layers_multiply_as_their_layer(rows):
    from benchmarks.bench_int4 import BenchConfig, Tiled, int4_layer

    config = BenchConfig(device=KERNEL_DEVICE.type, group_size=64)
    layer = int4_layer(320, 200, "triton", config, torch.float16)
    x = torch.randn(rows, 320, generator=torch.Generator().manual_seed(rows)).half()
    x = x.to(KERNEL_DEVICE)
    with torch.inference_mode():
        got, expected = Tiled(layer, Tiles(128, 16, 2))(x), layer(x)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_tiles_are_read_as_nxk_or_nxkxw_of_powers_of_two():
    assert Tiles.parse("128x32") == Tiles(128, 32, 4)
    assert str(Tiles.parse("64x64x8")) == "64x64x8"
    for bad in ("128", "128x32x4x1", "axb", "48x32", "64x8", "64x32x3"):
        with pytest.raises(ValueError, match="tiles are|power of two"):
            Tiles.parse(bad)


@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize(("product", "rows"), [(int4_gemv_triton, 3), (int4_gemm_triton, 40)])
def test_a_split_product_leaves_its_counters_at_zero_and_repeats_exactly(product, rows, splits):
    """The last slice of each output tile adds the partials and resets the tile's counter, so
    the next launch (or a graph's replay) starts from zero and sums the same way."""
    from servelab.kernels.int4_matmul_triton import _counters

    qweight, qzeros, scales, _ = random_int4(320, 200, 64, seed=7)  # four column tiles
    x = torch.randn(rows, 320, generator=torch.Generator().manual_seed(8))
    on = [t.to(KERNEL_DEVICE) for t in (x, qweight, qzeros, scales)]
    first = product(*on, 64, splits)
    assert not _counters(KERNEL_DEVICE, 4).any()
    assert torch.equal(product(*on, 64, splits), first)
    expected = int4_matmul_ref(x, qweight, qzeros, scales, 64)
    torch.testing.assert_close(first.cpu(), expected, atol=1e-5, rtol=1e-5)


def test_decode_batches_take_the_gemv_and_larger_ones_the_tiled_gemm():
    qweight, qzeros, scales, _ = random_int4(256, 64, 64, seed=2)
    on = [t.to(KERNEL_DEVICE) for t in (qweight, qzeros, scales)]
    for rows in (1, GEMV_ROWS, GEMV_ROWS + 1):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(KERNEL_DEVICE)
        gemv = int4_gemv_triton(x, *on, 64)
        same = torch.equal(int4_matmul_triton(x, *on, 64), gemv)
        assert same == (rows <= GEMV_ROWS), rows  # the GEMM sums in another order


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("rows", "in_features", "group"), [(1, 576, 128), (32, 1536, 128)])
def test_cpu_packed_matches_reference(cpu_build, rows, in_features, group, dtype):
    qweight, qzeros, scales, _ = random_int4(in_features, 192, group, seed=5)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(6))
    packed, pairs = to_cpu_packed(qweight, qzeros, scales, group, dtype)
    cpu_group = 64 if in_features == 576 else 128  # 128 does not divide 576: groups of 64
    got = int4_matmul_cpu(x.to(dtype), packed, pairs, cpu_group)
    expected = int4_matmul_ref(x, qweight, qzeros, scales, group)
    tolerance = {torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tolerance * 4, rtol=tolerance)


def test_kernel_choice():
    def chosen(dtype, in_features=576, impl="auto", device=CPU):
        return choose_kernel(impl, device, dtype, in_features, 192, 128).name

    assert chosen(torch.bfloat16) == "torch-packed"
    assert chosen(torch.float16) == "reference"  # measured faster there than torch-packed
    # exact, for quality measurements: the dense panels' sums of the dequantised weight
    assert chosen(torch.float32) == ("reference" if cpu_ops() is None else "cpu-panels")
    assert chosen(torch.float32, impl="reference") == "reference"
    assert chosen(torch.bfloat16, in_features=200) == "reference"  # gcd(200, 128) = 8
    if interpreted():  # tests on a CPU-only host run Triton in its interpreter
        assert chosen(torch.float32, impl="triton") == "triton"
    else:  # a CUDA host compiles it, for CUDA tensors only
        with pytest.raises(ConfigError, match="needs a CUDA device"):
            chosen(torch.float32, impl="triton")
    if torch.cuda.is_available():
        assert chosen(torch.float16, device=torch.device("cuda")) == "triton"
    with pytest.raises(ConfigError, match="strategy.int4_kernel"):
        chosen(torch.bfloat16, in_features=200, impl="torch-packed")
    with pytest.raises(ConfigError, match="strategy.int4_kernel"):
        chosen(torch.bfloat16, impl="triton")  # the interpreter gets bfloat16 wrong
    with pytest.raises(ConfigError, match="divisible by 8"):
        choose_kernel("auto", CPU, torch.bfloat16, 576, 196, 128)
    with pytest.raises(ConfigError, match="cpu-panels needs a CPU, float32"):
        chosen(torch.bfloat16, impl="cpu-panels")


@pytest.mark.parametrize(
    ("rows", "in_features", "out_features", "group"),
    [(1, 576, 192, 128), (7, 200, 72, 64), (64, 130, 24, 32), (300, 96, 136, 32)],
)
def test_cpu_panels_are_the_dense_panels_of_the_dequantised_weight(
    cpu_build, rows, in_features, out_features, group
):
    """Bit for bit at every level, groups that do not divide the inputs (576 by 128, 130 by
    32) and outputs that are not a multiple of 16 included."""
    qweight, qzeros, scales, weight = random_int4(in_features, out_features, group, seed=rows)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(9))
    nibbles, zeros, group_scales = to_cpu_panels(qweight, qzeros, scales)
    assert nibbles.shape == (-(-out_features // 16), in_features, 8)
    ops = cpu_build.ops
    got = ops.int4_panel_linear_f32(x, nibbles, zeros, group_scales, group, out_features)
    dense = ops.panel_linear_f32(x, ops.pack_panels_f32(weight.t()), out_features)
    assert torch.equal(got, dense)
    torch.testing.assert_close(got, int4_matmul_ref(x, qweight, qzeros, scales, group))


def test_cpu_panels_refuse_operands_of_another_shape(cpu_build):
    qweight, qzeros, scales, _ = random_int4(64, 32, 32, seed=1)
    nibbles, zeros, group_scales = to_cpu_panels(qweight, qzeros, scales)
    with pytest.raises(RuntimeError, match="zero points and scales"):
        cpu_build.ops.int4_panel_linear_f32(
            torch.randn(2, 64), nibbles, zeros, zeros[:, :1], 32, 32
        )
    with pytest.raises(RuntimeError, match="nibbles are uint8"):
        cpu_build.ops.int4_panel_linear_f32(
            torch.randn(2, 64), nibbles, zeros, group_scales, 32, 40
        )


def test_few_rows_take_the_int4_loop_only_where_it_pays(cpu_build):
    # the loop's portable branch is correct but 5-12x slower than torch's AVX2 kernel
    qweight, qzeros, scales, _ = random_int4(576, 192, 64, seed=7)
    packed, pairs = to_cpu_packed(qweight, qzeros, scales, 64, torch.bfloat16)
    x = torch.randn(2, 576, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    got = int4_matmul_cpu(x, packed, pairs, 64)
    torchs = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, pairs)
    assert (int4_loop_block() is not None) == (cpu_build.level == "avx512-bf16")
    if int4_loop_block() is None:
        assert torch.equal(got, torchs)
