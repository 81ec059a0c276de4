"""The attention entry point: it writes the new keys and values at exactly the batch's slots,
then attends like naive dense attention, for both KV layouts and both implementations (the
Triton one in the interpreter when there is no CUDA), and reuses its per-batch plan across
layers. Bad configuration and bad batches fail with one clear error (the interpreter:
tests/conftest.py sets TRITON_INTERPRET).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from servelab.kernels import paged_attention_triton as tri
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.cpu_build import active_build_status
from tests.attention_cases import AttentionCase, CaseShape, dense_attention, make_case
from tests.conftest import CPU_IMPLS, attention_impl

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CPU = torch.device("cpu")
SCALE = 0.125
MIXED = ([9, 30, 1, 45, 17], [9, 1, 1, 6, 3])
DECODE = ([9, 30, 1, 45, 17, 64], [1] * 6)
# fresh prompts and a chunk over a cached prefix long enough for the CPU flash path
PREFILL = ([40, 50, 64, 17, 5], [40, 20, 1, 17, 2])
IMPLS = ["torch", "triton", *CPU_IMPLS]


def device_for(impl: str) -> torch.device:
    """Where an implementation's test runs: the CPU paths on the CPU, on a CUDA host too."""
    return CPU if impl.startswith("cpu") else DEVICE


def _run(attn: Attention, case: AttentionCase, device: torch.device = DEVICE) -> torch.Tensor:
    return attn(
        case.q,
        case.k_new,
        case.v_new,
        case.k_cache,
        case.v_cache,
        case.forward_batch().to(device),
        SCALE,
    )


def test_auto_picks_triton_on_cuda_and_the_compiled_cpu_path_elsewhere() -> None:
    expected = "cpu" if active_build_status() is None else "torch"
    assert Attention(AttentionConfig(), CPU).impl == expected
    assert Attention(AttentionConfig("torch"), DEVICE).impl == "torch"
    assert Attention(AttentionConfig("triton"), DEVICE).impl == "triton"
    if torch.cuda.is_available():
        assert Attention(AttentionConfig(), torch.device("cuda")).impl == "triton"


def test_unknown_impl_is_a_config_error() -> None:
    with pytest.raises(ValueError, match=r"attention\.impl: unknown 'flash'"):
        Attention(AttentionConfig("flash"), DEVICE)


def test_triton_on_cpu_without_interpreter_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tri, "interpreted", lambda: False)
    with pytest.raises(ValueError, match=r"attention\.impl: triton kernels need a CUDA device"):
        Attention(AttentionConfig("triton"), CPU)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_writes_new_kv_exactly_at_slot_mapping(
    impl: str, paged: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = device_for(impl)
    impl = attention_impl(impl, monkeypatch)
    case = make_case(*MIXED, CaseShape(paged=paged), device=device, new_in_cache=False)
    k_before, v_before = case.k_cache.clone(), case.v_cache.clone()
    _run(Attention(AttentionConfig(impl), device), case, device)
    hkv, d = case.shape.kv_heads, case.shape.head_dim
    k_flat, v_flat = case.k_cache.view(-1, hkv, d), case.v_cache.view(-1, hkv, d)
    assert torch.equal(k_flat[case.slot_mapping], case.k_new)
    assert torch.equal(v_flat[case.slot_mapping], case.v_new)
    untouched = torch.ones(k_flat.shape[0], dtype=torch.bool, device=device)
    untouched[case.slot_mapping] = False
    for after, before in ((k_flat, k_before), (v_flat, v_before)):
        before = before.view(-1, hkv, d)
        torch.testing.assert_close(
            after[untouched], before[untouched], rtol=0, atol=0, equal_nan=True
        )
    assert case.slot_mapping.unique().numel() == sum(MIXED[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("lens", [MIXED, DECODE, PREFILL], ids=["mixed", "decode", "prefill"])
def test_matches_dense_attention(
    impl: str, paged: bool, lens: tuple[list, list], monkeypatch: pytest.MonkeyPatch
) -> None:
    device = device_for(impl)
    impl = attention_impl(impl, monkeypatch)
    case = make_case(*lens, CaseShape(paged=paged), device=device, new_in_cache=False, seed=2)
    out = _run(Attention(AttentionConfig(impl), device), case, device)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    torch.testing.assert_close(out.double().cpu(), dense_attention(case, SCALE), atol=2e-5, rtol=0)


@pytest.mark.parametrize("group", [(4, 4), (9, 1)], ids=["mha", "mqa"])
def test_any_group_size(group: tuple[int, int]) -> None:
    shape = CaseShape(q_heads=group[0], kv_heads=group[1], head_dim=32, block_size=4)
    case = make_case(*MIXED, shape, device=DEVICE, new_in_cache=False, seed=4)
    out = _run(Attention(AttentionConfig(), DEVICE), case)
    torch.testing.assert_close(out.double().cpu(), dense_attention(case, SCALE), atol=2e-5, rtol=0)


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("head_dim", [20, 72, 128])
def test_fp32_cpu_paths_for_head_dims_beyond_one_block(
    impl: str, head_dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Head dims the fp32 loops take in blocks of 64 and a shorter last block (72, 128), and one
    they leave to the portable loops (20, not a multiple of 8), at every level."""
    impl = attention_impl(impl, monkeypatch)
    case = make_case(*MIXED, CaseShape(head_dim=head_dim), new_in_cache=False, seed=head_dim)
    out = _run(Attention(AttentionConfig(impl), CPU), case, CPU)
    torch.testing.assert_close(out.double().cpu(), dense_attention(case, SCALE), atol=2e-5, rtol=0)


@pytest.mark.parametrize("impl", ["torch", *CPU_IMPLS])
@pytest.mark.parametrize("lens", [MIXED, PREFILL], ids=["mixed", "prefill"])
def test_bfloat16_cpu_paths(
    impl: str, lens: tuple[list, list], monkeypatch: pytest.MonkeyPatch
) -> None:
    impl = attention_impl(impl, monkeypatch)
    case = make_case(*lens, CaseShape(), dtype=torch.bfloat16, new_in_cache=False, seed=6)
    out = Attention(AttentionConfig(impl), CPU)(
        case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, case.forward_batch(), SCALE
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_attention(case, SCALE), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("impl", IMPLS)
def test_one_batch_serves_every_layer(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan built on the first layer is reused; each layer still reads its own cache."""
    device = device_for(impl)
    impl = attention_impl(impl, monkeypatch)
    first = make_case(*MIXED, CaseShape(), device=device, new_in_cache=False, seed=8)
    second = make_case(*MIXED, CaseShape(), device=device, new_in_cache=False, seed=8)
    second = dataclasses.replace(
        second,
        k_new=-second.k_new,
        v_new=2 * second.v_new,
        contexts_k=[-k for k in second.contexts_k],
        contexts_v=[2 * v for v in second.contexts_v],
    )
    second.k_cache.neg_()
    second.v_cache.mul_(2)
    attn = Attention(AttentionConfig(impl), device)
    batch = first.forward_batch().to(device)
    for case in (first, second, first):
        out = attn(case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, batch, SCALE)
        torch.testing.assert_close(
            out.double().cpu(), dense_attention(case, SCALE), atol=2e-5, rtol=0
        )


def test_batch_without_a_kv_layout_is_a_config_error() -> None:
    case = make_case(*MIXED, CaseShape(), new_in_cache=False)
    batch = dataclasses.replace(case.forward_batch(), block_tables=None)
    with pytest.raises(ValueError, match="batch: set exactly one of block_tables"):
        Attention(AttentionConfig("torch"), CPU)(
            case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, batch, SCALE
        )


def test_block_size_mismatch_is_a_config_error() -> None:
    case = make_case(*MIXED, CaseShape(), new_in_cache=False)
    batch = dataclasses.replace(case.forward_batch(), block_size=8)
    with pytest.raises(ValueError, match="batch.block_size: 8 differs"):
        Attention(AttentionConfig("torch"), CPU)(
            case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, batch, SCALE
        )
