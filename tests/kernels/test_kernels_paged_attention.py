"""Attention over the KV cache: the PyTorch references against naive dense attention, and every
Triton kernel against its reference, over block sizes, group sizes (1, 3, 9), head dims and
ragged lengths that are not multiples of the block size.

Without CUDA the kernels run in the Triton interpreter: tests/conftest.py sets TRITON_INTERPRET
before anything imports triton. With CUDA they run compiled, and bfloat16 is checked too (the
interpreter computes it wrongly).
"""

from __future__ import annotations

import pytest
import torch

from servelab.kernels import paged_attention_ref as ref
from servelab.kernels import paged_attention_triton as tri
from servelab.kernels.paged_attention_ref import (
    contiguous_decode_ref,
    contiguous_extend_ref,
    paged_decode_ref,
    paged_extend_ref,
)
from tests.attention_cases import AttentionCase, CaseShape, dense_attention, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCALE = 0.125
# Ragged mix: a prefill, decodes (one of length 1), extends over a cached prefix whose new
# tokens cross block boundaries, lengths on and off block multiples.
MIXED_LENS = [7, 23, 37, 1, 70, 19, 16]
MIXED_NEW = [7, 1, 5, 1, 1, 11, 16]
DECODE_LENS = [1, 5, 16, 17, 33, 70, 3]
GROUPS = {1: (4, 4), 3: (9, 3), 9: (9, 1)}  # group size -> (q heads, kv heads)
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _shape(group: int, block_size: int, paged: bool, head_dim: int = 64) -> CaseShape:
    q_heads, kv_heads = GROUPS[group]
    return CaseShape(q_heads, kv_heads, head_dim, block_size, paged)


def _decode_ref(case: AttentionCase) -> torch.Tensor:
    ref = paged_decode_ref if case.shape.paged else contiguous_decode_ref
    return ref(case.q, case.k_cache, case.v_cache, case.kv_index, case.seq_lens, SCALE)


def _extend_ref(case: AttentionCase) -> torch.Tensor:
    ref = paged_extend_ref if case.shape.paged else contiguous_extend_ref
    return ref(
        case.q,
        case.k_cache,
        case.v_cache,
        case.kv_index,
        case.seq_lens,
        case.query_start_loc,
        SCALE,
    )


def _decode_triton(case: AttentionCase, launch: tri.DecodeLaunch | None = None) -> torch.Tensor:
    kernel = tri.paged_decode_triton if case.shape.paged else tri.contiguous_decode_triton
    return kernel(
        case.q, case.k_cache, case.v_cache, case.kv_index, case.seq_lens, SCALE, launch=launch
    )


def _extend_triton(case: AttentionCase) -> torch.Tensor:
    kernel = tri.paged_extend_triton if case.shape.paged else tri.contiguous_extend_triton
    return kernel(
        case.q,
        case.k_cache,
        case.v_cache,
        case.kv_index,
        case.seq_lens,
        case.query_start_loc,
        SCALE,
    )


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    assert actual.shape == expected.shape
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=tol, rtol=tol)


# --- references against naive dense attention (no cache) ---------------------------------


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("group", [1, 3, 9])
@pytest.mark.parametrize("block_size", [4, 16])
def test_extend_ref_matches_dense(paged: bool, group: int, block_size: int) -> None:
    case = make_case(MIXED_LENS, MIXED_NEW, _shape(group, block_size, paged), seed=group)
    _close(_extend_ref(case), dense_attention(case, SCALE), torch.float32)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_extend_ref_through_sdpa_matches_dense(
    paged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long sequences take SDPA instead of explicit scores; force that path on small ones."""
    monkeypatch.setattr(ref, "DENSE_SCORES_LIMIT", 0)
    case = make_case(MIXED_LENS, MIXED_NEW, _shape(3, 4, paged), seed=12)
    _close(_extend_ref(case), dense_attention(case, SCALE), torch.float32)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("group", [1, 3, 9])
def test_decode_ref_matches_dense(paged: bool, group: int) -> None:
    case = make_case(DECODE_LENS, [1] * len(DECODE_LENS), _shape(group, 4, paged), seed=7)
    _close(_decode_ref(case), dense_attention(case, SCALE), torch.float32)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_ref_over_several_chunks(paged: bool, dtype: torch.dtype) -> None:
    """Several length-sorted chunks (or, float32 contiguous, one slab view per sequence)."""
    lens = [(7 * i) % 41 + 1 for i in range(35)]
    case = make_case(lens, [1] * len(lens), _shape(3, 4, paged, head_dim=16), dtype=dtype)
    _close(_decode_ref(case), dense_attention(case, SCALE), dtype)


def test_plan_chunks_decode_rows_by_length() -> None:
    lens = [(7 * i) % 41 + 1 for i in range(35)]
    news = MIXED_NEW + [1] * 35
    case = make_case(MIXED_LENS + lens, news, _shape(3, 4, True))
    plan = ref.plan_for(
        case.q.bfloat16(), case.k_cache, case.seq_lens, case.query_start_loc, case.kv_index, None
    )
    decode_rows = [
        r for r, n in zip(case.query_start_loc[:-1].tolist(), news, strict=True) if n == 1
    ]
    assert [len(c.rows) for c in plan.decode_chunks] == [8, 8, 8, 8, 6]
    assert sorted(torch.cat([c.rows for c in plan.decode_chunks]).tolist()) == decode_rows
    chunk_lens = torch.cat([c.mask.sum(1) for c in plan.decode_chunks]).tolist()
    assert chunk_lens == sorted(chunk_lens, reverse=True)
    assert [s.num_rows for s in plan.seqs] == [n for n in MIXED_NEW if n > 1]


def test_plan_float32_contiguous_attends_each_sequence_alone() -> None:
    case = make_case(DECODE_LENS, [1] * len(DECODE_LENS), _shape(3, 4, False))
    plan = ref.plan_for(
        case.q, case.k_cache, case.seq_lens, case.query_start_loc, None, case.slab_starts
    )
    assert plan.decode_chunks == []
    assert [(s.slab_start, s.seq_len, s.mask) for s in plan.seqs] == [
        (int(start), n, None) for start, n in zip(case.slab_starts, DECODE_LENS, strict=True)
    ]


@pytest.mark.parametrize("group", [1, 3, 9])
def test_half_precision_refs_match_dense(group: int) -> None:
    shape = _shape(group, 16, True)
    case = make_case(MIXED_LENS, MIXED_NEW, shape, dtype=torch.bfloat16, seed=21)
    _close(_extend_ref(case), dense_attention(case, SCALE), torch.bfloat16)
    decode = make_case(DECODE_LENS, [1] * len(DECODE_LENS), shape, dtype=torch.bfloat16)
    _close(_decode_ref(decode), dense_attention(decode, SCALE), torch.bfloat16)


def test_ref_reads_only_context_slots() -> None:
    """Every slot outside the contexts is NaN: a single stray read would poison the output."""
    case = make_case(MIXED_LENS, MIXED_NEW, _shape(3, 16, True), seed=11)
    assert torch.isnan(case.k_cache).any()
    assert torch.isfinite(_extend_ref(case)).all()


def test_ref_rejects_bad_query_start_loc() -> None:
    case = make_case([5, 3], [2, 1], _shape(3, 4, True))
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_extend_ref(
            case.q,
            case.k_cache,
            case.v_cache,
            case.kv_index,
            case.seq_lens,
            torch.tensor([0, 2], dtype=torch.int32),
            SCALE,
        )


# --- Triton kernels against the references ------------------------------------------------


@pytest.mark.parametrize("group", [1, 3, 9])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("forced", [False, True], ids=["heuristic", "3-splits"])
def test_paged_decode_triton(group: int, block_size: int, forced: bool) -> None:
    case = make_case(
        DECODE_LENS, [1] * len(DECODE_LENS), _shape(group, block_size, True), device=DEVICE
    )
    launch = tri.make_launch(16, max(DECODE_LENS), 3) if forced else None
    if forced:
        assert launch.num_splits == 3
    _close(_decode_triton(case, launch), _decode_ref(case), torch.float32)


@pytest.mark.parametrize("group", [1, 3, 9])
def test_contiguous_decode_triton(group: int) -> None:
    case = make_case(DECODE_LENS, [1] * len(DECODE_LENS), _shape(group, 16, False), device=DEVICE)
    launch = tri.make_launch(16, max(DECODE_LENS), 4)
    _close(_decode_triton(case, launch), _decode_ref(case), torch.float32)


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("group", [1, 3, 9])
@pytest.mark.parametrize("block_size", [4, 16])
def test_extend_triton(paged: bool, group: int, block_size: int) -> None:
    case = make_case(MIXED_LENS, MIXED_NEW, _shape(group, block_size, paged), device=DEVICE)
    _close(_extend_triton(case), _extend_ref(case), torch.float32)


def test_extend_triton_prefill_only() -> None:
    lens = [3, 20, 9]
    case = make_case(lens, lens, _shape(3, 4, True), device=DEVICE, seed=5)
    _close(_extend_triton(case), _extend_ref(case), torch.float32)


@pytest.mark.parametrize("head_dim", [128, 40])
def test_kernels_other_head_dims(head_dim: int) -> None:
    shape = _shape(3, 16, True, head_dim=head_dim)
    case = make_case(MIXED_LENS, MIXED_NEW, shape, device=DEVICE, seed=head_dim)
    _close(_extend_triton(case), _extend_ref(case), torch.float32)
    decode = make_case(DECODE_LENS, [1] * len(DECODE_LENS), shape, device=DEVICE)
    launch = tri.make_launch(16, max(DECODE_LENS), 2)
    _close(_decode_triton(decode, launch), _decode_ref(decode), torch.float32)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(DEVICE != "cuda", reason="interpreter computes bf16 wrongly"),
        ),
    ],
)
def test_kernels_half_precision(dtype: torch.dtype) -> None:
    shape = _shape(3, 16, True)
    case = make_case(MIXED_LENS, MIXED_NEW, shape, dtype=dtype, device=DEVICE)
    _close(_extend_triton(case), _extend_ref(case).to(dtype), dtype)
    decode = make_case(DECODE_LENS, [1] * len(DECODE_LENS), shape, dtype=dtype, device=DEVICE)
    _close(_decode_triton(decode), _decode_ref(decode), dtype)


def test_decode_launch_heuristic() -> None:
    cpu = torch.device("cpu")
    assert tri.decode_launch(4, 3, 70, 64, cpu) == tri.DecodeLaunch(64, 1, 128)
    assert tri.make_launch(16, 70, 3) == tri.DecodeLaunch(16, 3, 32)
    assert tri.make_launch(16, 70, 100) == tri.DecodeLaunch(16, 5, 16)
    assert tri.make_launch(32, 2048, 8) == tri.DecodeLaunch(32, 8, 256)


def test_decode_rejects_launch_that_misses_positions() -> None:
    case = make_case(DECODE_LENS, [1] * len(DECODE_LENS), _shape(3, 4, True), device=DEVICE)
    with pytest.raises(ValueError, match="launch"):
        _decode_triton(case, tri.DecodeLaunch(16, 2, 16))
