"""The CPU attention paths per layer call on the embedded model's head layout (9 query heads,
3 KV heads, dim 64) in bf16, the CPU default: the PyTorch reference
(`Attention(AttentionConfig("torch"), cpu)`) and the compiled operators ("cpu").

A model step calls attention once per layer with the same batch: the first call builds the
batch's plan, the other 29 reuse it. `decode` times a reused plan (the common call);
`decode, new plan` a call on a fresh batch; `prefill` a mixed batch of new prompts. The
decode step of 64 sequences reads 30 distinct layer caches per round, as the model does:
together they are larger than L3, so the operator is timed reading memory, not cache (one
cache re-read 30 times measured a third of the time on the development CPU).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.cpu_build import active_build_status
from tests.attention_cases import AttentionCase, CaseShape, make_case

CPU = torch.device("cpu")
SCALE = 64**-0.5


def _case(seq_lens: list[int], query_lens: list[int]) -> AttentionCase:
    return make_case(seq_lens, query_lens, CaseShape(), dtype=torch.bfloat16, new_in_cache=False)


@pytest.mark.parametrize("batch", [8, 32])
def test_decode_context_256(benchmark, batch: int) -> None:
    case = _case([256] * batch, [1] * batch)
    attention = Attention(AttentionConfig("torch"), CPU)
    forward = case.forward_batch()
    benchmark.group = "attention"

    def call() -> torch.Tensor:
        return attention(case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, forward, SCALE)

    assert benchmark(call).shape == case.q.shape


def test_decode_context_256_new_plan(benchmark) -> None:
    case = _case([256] * 32, [1] * 32)
    attention = Attention(AttentionConfig("torch"), CPU)
    forward = case.forward_batch()
    benchmark.group = "attention"

    def call() -> torch.Tensor:
        fresh = dataclasses.replace(forward)  # a new batch object: its plan is built again
        return attention(case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, fresh, SCALE)

    assert benchmark(call).shape == case.q.shape


def test_prefill_4_prompts_of_128(benchmark) -> None:
    case = _case([128] * 4, [128] * 4)
    attention = Attention(AttentionConfig("torch"), CPU)
    forward = case.forward_batch()
    benchmark.group = "attention"

    def call() -> torch.Tensor:
        return attention(case.q, case.k_new, case.v_new, case.k_cache, case.v_cache, forward, SCALE)

    assert benchmark(call).shape == case.q.shape


@pytest.mark.parametrize("impl", ["torch", "cpu"])
def test_decode_64_contexts_32_to_256_over_30_layers(benchmark, impl: str) -> None:
    if impl == "cpu" and active_build_status() is not None:
        pytest.skip(f"the CPU operator is not built here: {active_build_status()}")
    lengths = torch.linspace(32, 256, 64).round().int().tolist()
    layers = [_case(lengths, [1] * 64) for _ in range(30)]  # same layout, distinct memory
    attention = Attention(AttentionConfig(impl), CPU)
    first = layers[0]
    forward = first.forward_batch()
    benchmark.group = "attention, 30 layers"

    def call() -> torch.Tensor:
        for layer in layers:
            out = attention(
                first.q, first.k_new, first.v_new, layer.k_cache, layer.v_cache, forward, SCALE
            )
        return out

    assert benchmark(call).shape == first.q.shape
