"""The CPU attention path per layer call (`Attention(AttentionConfig("torch"), cpu)`), on the
embedded model's head layout (9 query heads, 3 KV heads, dim 64) in bf16, the CPU default.

A model step calls attention once per layer with the same batch: the first call builds the
batch's plan, the other 29 reuse it. `decode` times a reused plan (the common call);
`decode, new plan` a call on a fresh batch; `prefill` a mixed batch of new prompts.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.attention import Attention, AttentionConfig
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
