"""`servelab::flash_attention`, the bfloat16 prefill kernel, attends like dense attention.

Row i of `n` new rows over `L` keys sees keys 0 .. L - n + i. Checked against fp64 dense
attention of the same bfloat16 operands for every head dim it tiles, several group sizes,
lengths that end inside a 64-key block and a 32-position work item, and new rows after a
cached prefix; and against torch's CPU flash kernel, the path it replaces, on the model's
shape. The entry point's own bfloat16 prefill cases (`test_attention_entry.py`) run through it
too. Run at each ISA level this CPU runs, skipped at levels whose build has no such operator
(below `avx512-bf16`).
"""

from __future__ import annotations

import pytest
import torch

from servelab.kernels.cpu_attention import own_flash_fits
from tests.conftest import CpuBuild

BF16 = torch.bfloat16


@pytest.fixture
def ops(cpu_build: CpuBuild) -> object:
    """The flash operator's build, where the level has one."""
    if not hasattr(cpu_build.ops, "flash_attention"):
        pytest.skip(f"the {cpu_build.level} build has no flash_attention (AVX-512 BF16)")
    return cpu_build.ops


def _operands(
    n: int, L: int, q_heads: int, kv_heads: int, dim: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(n, q_heads, dim, generator=generator).to(BF16)
    k = (2 * torch.randn(L, kv_heads, dim, generator=generator)).to(BF16)
    v = torch.randn(L, kv_heads, dim, generator=generator).to(BF16)
    return q, k, v


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    n, L = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    keys = k.double().repeat_interleave(group, 1)
    values = v.double().repeat_interleave(group, 1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), keys) * scale
    hidden = torch.arange(L)[None, :] > (torch.arange(n) + L - n)[:, None]
    weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("hnl,lhd->nhd", weights, values)


@pytest.mark.parametrize(
    ("n", "L", "q_heads", "kv_heads", "dim"),
    [
        (1, 1, 1, 1, 64),  # one row, one key
        (5, 5, 3, 1, 64),  # fewer rows than one register tile
        (200, 200, 9, 3, 64),  # the model's heads; ends inside a key block and a work item
        (129, 129, 6, 2, 64),  # one position past four blocks
        (64, 64, 4, 4, 128),  # no grouping, the widest head
        (70, 77, 8, 8, 32),  # the narrowest head, seven keys of prefix
        (37, 300, 9, 3, 64),  # new rows after a long cached prefix
    ],
)
def test_matches_dense_causal_attention(
    ops: object, n: int, L: int, q_heads: int, kv_heads: int, dim: int
) -> None:
    q, k, v = _operands(n, L, q_heads, kv_heads, dim, seed=n + L + dim)
    scale = dim**-0.5
    got = ops.flash_attention(q, k, v, scale)
    assert got.dtype == BF16 and got.shape == q.shape
    # probabilities rounded to bfloat16 before the value product, then the output's rounding
    torch.testing.assert_close(got.double(), _dense(q, k, v, scale), atol=1.6e-2, rtol=1e-2)


def test_agrees_with_torchs_flash_kernel_on_the_models_shape(ops: object) -> None:
    q, k, v = _operands(300, 300, 9, 3, 64, seed=3)
    got = ops.flash_attention(q, k, v, 0.125)
    keys = k.transpose(0, 1).repeat_interleave(3, 0).unsqueeze(0)
    values = v.transpose(0, 1).repeat_interleave(3, 0).unsqueeze(0)
    theirs, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(0, 1).unsqueeze(0), keys, values, is_causal=True, scale=0.125
    )
    torch.testing.assert_close(
        got.double(), theirs[0].transpose(0, 1).double(), atol=1.6e-2, rtol=1e-2
    )


def test_the_entry_point_takes_it_only_for_bfloat16_and_tiled_head_dims(ops: object) -> None:
    assert own_flash_fits(torch.empty(4, 9, 64, dtype=BF16))
    assert not own_flash_fits(torch.empty(4, 9, 64, dtype=torch.float32))
    assert not own_flash_fits(torch.empty(4, 9, 80, dtype=BF16))


def test_unsupported_head_dims_and_dtypes_are_refused(ops: object) -> None:
    q, k, v = _operands(4, 4, 2, 1, 64, seed=0)
    with pytest.raises(RuntimeError, match="bfloat16"):
        ops.flash_attention(q.float(), k.float(), v.float(), 0.125)
    q, k, v = _operands(4, 4, 2, 1, 48, seed=0)
    with pytest.raises(RuntimeError, match="head dims"):
        ops.flash_attention(q, k, v, 0.125)
