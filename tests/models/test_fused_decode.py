"""The fused CPU decoder layer computes what the layer modules compute.

Its matrix-vector product and its panel products (the packed layout, plain and SwiGLU-gated)
against fp32 products of the same bfloat16 operands; whole decode
steps (paged and contiguous caches, one and several new tokens per sequence, dense and int4
weights) against the eager model: the same keys and values written at the same slots and the
same logits up to bfloat16 rounding of differently ordered sums; and when the engine installs
it (bfloat16 on the CPU operator, `engine.fused_decode=auto`) and when it does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from servelab.base.batch import ForwardBatch
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.capabilities import torch_int4_block
from servelab.kernels.cpu_attention import FLASH_ROWS
from servelab.models.fused_decode import fused_decode_layers
from tests.conftest import CpuBuild
from tests.int4_cases import (
    context,
    pack_int4_blocked,
    served_model,
    tiny_checkpoint,
    weights_format,
)
from tests.tiny import CPU, tiny_model

# every test here at each ISA level this CPU runs, on that level's build
pytestmark = pytest.mark.usefixtures("cpu_build")

BF16 = torch.bfloat16
MAX_LEN = 64  # slots per sequence in the contiguous layout
BLOCK = 4


@pytest.mark.parametrize(("rows", "k_len", "n_len"), [(1, 64, 5), (3, 100, 130), (8, 577, 33)])
def test_matvec_is_the_product_of_its_bfloat16_operands(
    cpu_build: CpuBuild, rows: int, k_len: int, n_len: int
) -> None:
    generator = torch.Generator().manual_seed(rows + k_len)
    x = torch.randn(rows, k_len, generator=generator).to(BF16)
    w = torch.randn(n_len, k_len, generator=generator).to(BF16)
    exact = x.float() @ w.float().t()
    got = cpu_build.ops.matvec(x, w)
    assert got.dtype == BF16 and got.shape == (rows, n_len)
    # one bfloat16 rounding of the fp32 sum (2^-8 relative), plus fp32 summation order
    torch.testing.assert_close(got.float(), exact, rtol=2**-8, atol=1e-4 * k_len**0.5)


def _needs_panels(cpu_build: CpuBuild) -> None:
    if not cpu_build.ops.panel_products_available():
        pytest.skip(f"the {cpu_build.level} build has no panel products (AVX-512 BF16)")


def _padded_panels(w: torch.Tensor) -> torch.Tensor:
    """The panel layout built by indexing: [ceil(N / 32), ceil(K / 2), 32, 2], zero-padded."""
    n_len, k_len = w.shape
    panels, pairs = -(-n_len // 32), -(-k_len // 2)
    padded = torch.zeros(panels * 32, pairs * 2, dtype=w.dtype)
    padded[:n_len, :k_len] = w
    return padded.view(panels, 32, pairs, 2).permute(0, 2, 1, 3).contiguous()


@pytest.mark.parametrize(
    ("rows", "k_len", "n_len"), [(9, 64, 5), (15, 101, 130), (64, 576, 200), (70, 1536, 96)]
)
def test_panel_products_are_the_product_of_their_bfloat16_operands(
    cpu_build: CpuBuild, rows: int, k_len: int, n_len: int
) -> None:
    _needs_panels(cpu_build)
    ops = cpu_build.ops
    generator = torch.Generator().manual_seed(rows + k_len)
    x = torch.randn(rows, k_len, generator=generator).to(BF16)
    w = torch.randn(n_len, k_len, generator=generator).to(BF16)
    panels = ops.pack_panels(w)
    assert torch.equal(panels, _padded_panels(w))
    got = ops.panel_linear(x, panels, n_len)
    assert got.dtype == BF16 and got.shape == (rows, n_len)
    exact = x.float() @ w.float().t()
    torch.testing.assert_close(got.float(), exact, rtol=2**-8, atol=1e-4 * k_len**0.5)
    # a residual is added to the rounded product and rounded again, as the eager add does
    residual = torch.randn(rows, n_len, generator=generator).to(BF16)
    plus = ops.panel_linear(x, panels, n_len, residual)
    assert torch.equal(plus, got + residual)
    with pytest.raises(RuntimeError, match="panels are `pack_panels` of a bfloat16 weight"):
        ops.panel_linear(x, panels, n_len + 32)


@pytest.mark.parametrize(("rows", "k_len", "n_len"), [(13, 96, 70), (64, 577, 160)])
def test_panel_swiglu_rounds_as_the_eager_swiglu(
    cpu_build: CpuBuild, rows: int, k_len: int, n_len: int
) -> None:
    _needs_panels(cpu_build)
    ops = cpu_build.ops
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k_len, generator=generator).to(BF16)
    gate, up = (torch.randn(n_len, k_len, generator=generator).to(BF16) for _ in range(2))
    gate_panels, up_panels = (ops.pack_panels(w) for w in (gate, up))
    got = ops.panel_swiglu(x, gate_panels, up_panels, n_len)
    # the eager SwiGLU of the same products (same sums, so the same bfloat16 gate and up)
    gate_y = ops.panel_linear(x, gate_panels, n_len)
    up_y = ops.panel_linear(x, up_panels, n_len)
    want = torch.nn.functional.silu(gate_y) * up_y
    # silu's exponential is a polynomial here: at most one bfloat16 step apart, rarely
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)
    assert (got == want).float().mean() >= 0.99


@pytest.mark.parametrize("block", [64, 32], ids=["avx512-packing", "avx2-packing"])
@pytest.mark.parametrize(
    ("rows", "k_len", "n_len", "group"), [(1, 576, 192, 64), (4, 256, 64, 128), (3, 128, 96, 32)]
)
def test_int4_matvec_is_the_product_of_the_dequantised_weight(
    cpu_build: CpuBuild, block: int, rows: int, k_len: int, n_len: int, group: int
) -> None:
    # both of torch's packings, whatever torch runs here: each is built by indexing
    if n_len % block:
        pytest.skip(f"{n_len} outputs are not whole blocks of {block}")
    generator = torch.Generator().manual_seed(rows)
    values = torch.randint(0, 16, (n_len, k_len), generator=generator, dtype=torch.int32)
    packed = pack_int4_blocked(values, block)
    pairs = torch.randn(k_len // group, n_len, 2, generator=generator).to(BF16)
    x = torch.randn(rows, k_len, generator=generator).to(BF16)
    scale = pairs[..., 0].float().repeat_interleave(group, 0)  # [K, N]
    offset = pairs[..., 1].float().repeat_interleave(group, 0)
    exact = x.float() @ ((values.t().float() - 8) * scale + offset)
    got = cpu_build.ops.int4_matvec(x, packed, pairs, group, block)
    torch.testing.assert_close(got.float(), exact, rtol=2**-8, atol=1e-3 * exact.abs().max().item())
    with pytest.raises(RuntimeError, match="at most 4 rows"):
        cpu_build.ops.int4_matvec(x.repeat(5, 1), packed, pairs, group, block)


def test_the_probe_reads_torchs_own_int4_packing() -> None:
    values = torch.randint(0, 16, (128, 64), generator=torch.Generator().manual_seed(3))
    block = torch_int4_block()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values.to(torch.int32), 2)
    if block is None:
        assert not any(torch.equal(packed, pack_int4_blocked(values, b)) for b in (32, 64))
    else:
        assert torch.equal(packed, pack_int4_blocked(values, block))


def _batch(
    lengths: list[int], new: list[int], paged: bool, generator: torch.Generator
) -> ForwardBatch:
    """Sequence b has `lengths[b] - new[b]` cached tokens and `new[b]` new ones."""
    positions, slots, ids = [], [], []
    blocks_per_seq = MAX_LEN // BLOCK
    order = torch.randperm(len(lengths) * blocks_per_seq, generator=generator)
    tables = order.view(len(lengths), blocks_per_seq).to(torch.int32)
    for b, (length, count) in enumerate(zip(lengths, new, strict=True)):
        for pos in range(length - count, length):
            positions.append(pos)
            if paged:
                slots.append(int(tables[b, pos // BLOCK]) * BLOCK + pos % BLOCK)
            else:
                slots.append(b * MAX_LEN + pos)
        ids += torch.randint(17, 4000, (count,), generator=generator).tolist()
    starts = torch.zeros(len(new) + 1, dtype=torch.int32)
    starts[1:] = torch.tensor(new).cumsum(0)
    return ForwardBatch(
        input_ids=torch.tensor(ids),
        positions=torch.tensor(positions),
        query_start_loc=starts,
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        query_lens=list(new),
        slot_mapping=torch.tensor(slots),
        logits_indices=torch.arange(sum(new)),
        slab_starts=None if paged else torch.arange(len(new)) * MAX_LEN,
        block_tables=tables if paged else None,
        block_size=BLOCK if paged else 1,
    )


def _caches(model, paged: bool, seqs: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    config = model.config
    shape = (
        (seqs * MAX_LEN // BLOCK, BLOCK, config.num_kv_heads, config.head_dim)
        if paged
        else (seqs * MAX_LEN, 1, config.num_kv_heads, config.head_dim)
    )
    make = [torch.zeros(shape, dtype=BF16) for _ in range(2 * config.num_layers)]
    return make[: config.num_layers], make[config.num_layers :]


@torch.inference_mode()
def _compare_decode_step(model, paged: bool, new: list[int]) -> None:
    """Prefill three prompts eagerly, then one step of `new` tokens each, eager and fused."""
    generator = torch.Generator().manual_seed(7)
    prompts = [9, 30, 17]
    attention = Attention(AttentionConfig("cpu"), CPU)
    runner = fused_decode_layers(model, BF16, CPU, attention.impl)
    assert runner is not None
    k_caches, v_caches = _caches(model, paged, len(prompts))
    model.layer_runner = None
    model(_batch(prompts, prompts, paged, generator), k_caches, v_caches, attention)
    lengths = [p + n for p, n in zip(prompts, new, strict=True)]
    step = _batch(lengths, new, paged, generator)
    assert runner.accepts(step, torch.zeros(1, dtype=BF16))

    eager_k, eager_v = [c.clone() for c in k_caches], [c.clone() for c in v_caches]
    eager = model(step, eager_k, eager_v, Attention(AttentionConfig("cpu"), CPU))
    model.layer_runner = runner
    fused = model(step, k_caches, v_caches, Attention(AttentionConfig("cpu"), CPU))
    model.layer_runner = None

    for got, want in zip(k_caches + v_caches, eager_k + eager_v, strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=2e-2)
    scale = eager.abs().max().item()
    torch.testing.assert_close(fused, eager, rtol=0.0, atol=0.02 * scale)
    assert (fused.argmax(-1) == eager.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize(
    "new", [[1, 1, 1], [1, 3, 2], [5, 4, 6]], ids=["decode", "verify", "blocked-rows"]
)
def test_dense_decode_step_matches_the_layer_modules(paged: bool, new: list[int]) -> None:
    _compare_decode_step(tiny_model(dtype=BF16, vocab_size=4096), paged, new)


def test_int4_decode_step_matches_the_layer_modules(tmp_path: Path) -> None:
    weights = weights_format("int4-rtn", int4_kernel="torch-packed", group_size=64)
    model = served_model(tiny_checkpoint(), weights, context(tmp_path, BF16))
    runner = fused_decode_layers(model, BF16, CPU, "cpu")
    assert runner is not None and runner.layers[0].int4_groups == [64] * 7
    _compare_decode_step(model, True, [1, 2, 1])
    _compare_decode_step(model, True, [5, 4, 6])  # beyond the int4 loop: torch's kernel


def test_only_bfloat16_batches_of_short_sequences_on_the_cpu_operator_take_it() -> None:
    model = tiny_model(dtype=BF16, vocab_size=4096)
    assert fused_decode_layers(model, torch.float32, CPU, "cpu") is None
    assert fused_decode_layers(model, BF16, CPU, "torch") is None
    runner = fused_decode_layers(model, BF16, CPU, "cpu")
    generator = torch.Generator().manual_seed(0)
    x = torch.zeros(1, dtype=BF16)
    assert runner.accepts(_batch([5] * 12, [1] * 12, True, generator), x)
    assert runner.accepts(_batch([20, 5], [FLASH_ROWS - 1, 1], True, generator), x)
    assert not runner.accepts(_batch([20, 5], [FLASH_ROWS, 1], True, generator), x)
    assert not runner.accepts(_batch([5] * 12, [1] * 12, True, generator), x.float())
    fp32 = tiny_model(vocab_size=4096)
    assert fused_decode_layers(fp32, torch.float32, CPU, "cpu") is None
