"""The fused layer kernels (`kernels/layer_triton.py`) against the eager modules they replace,
through the Triton interpreter on a CPU (compiled where CUDA runs), in fp32 and fp16 (the
interpreter computes bfloat16 wrongly)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from servelab.kernels.layer_triton import add_rmsnorm, rotary_write_kv, silu_mul
from servelab.models.model import RMSNorm, RotaryEmbedding, apply_rotary

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


def close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().float(), expected.cpu().float(), atol=tol, rtol=tol)


def randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 96])  # a power of two, and one the block pads
def test_add_rmsnorm_is_the_residual_add_then_the_norm(dtype: torch.dtype, hidden: int) -> None:
    norm = RMSNorm(hidden, 1e-5).to(dtype).to(DEVICE)
    norm.weight.data = randn(hidden, dtype=dtype, seed=1)
    x, residual = randn(5, hidden, dtype=dtype, seed=2), randn(5, hidden, dtype=dtype, seed=3)
    summed = x + residual
    with torch.inference_mode():
        got = add_rmsnorm(x, residual, norm.weight, norm.eps)
        close(residual, summed, dtype)  # the sum is written back for the next layer
        close(got, norm(summed), dtype)
        close(add_rmsnorm(x, None, norm.weight, norm.eps), norm(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [True, False])
def test_rotary_write_kv_rotates_queries_and_keys_and_stores_keys_and_values(
    dtype: torch.dtype, paged: bool
) -> None:
    heads, kv_heads, head_dim, tokens = 4, 2, 32, 6
    rotary = RotaryEmbedding(head_dim, 128, 10000.0).to(DEVICE)
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, seed=4)
    positions = torch.tensor([0, 5, 17, 3, 64, 127], device=DEVICE)
    block_size = 4 if paged else 1
    slots = torch.tensor([9, 2, 30, 31, 0, 17], device=DEVICE)
    k_cache = torch.full((40 // block_size, block_size, kv_heads, head_dim), float("nan"),
                         dtype=dtype, device=DEVICE)  # fmt: skip
    v_cache = torch.full_like(k_cache, float("nan"))
    with torch.inference_mode():
        q = rotary_write_kv(qkv, rotary.cos, rotary.sin, positions, slots, k_cache, v_cache, heads)
        cos, sin = rotary(positions, dtype)
        q_ref, k_ref, v_ref = qkv.split(
            [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1
        )
        close(q, apply_rotary(q_ref.view(tokens, heads, head_dim), cos, sin), dtype)
        flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)
        close(
            flat_k[slots], apply_rotary(k_ref.reshape(tokens, kv_heads, head_dim), cos, sin), dtype
        )
        assert torch.equal(flat_v[slots], v_ref.reshape(tokens, kv_heads, head_dim))
        untouched = torch.ones(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
        untouched[slots] = False
        assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner", [64, 1500])  # one block, and several with a ragged last
def test_silu_mul_is_the_swiglu_product(dtype: torch.dtype, inner: int) -> None:
    gate_up = randn(3, 2 * inner, dtype=dtype, seed=5)
    gate, up = gate_up.chunk(2, dim=-1)
    with torch.inference_mode():
        close(silu_mul(gate_up), F.silu(gate) * up, dtype)
