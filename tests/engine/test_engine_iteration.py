"""Iteration-level scheduling on a tiny random model: lossless, joins and leaves every step."""

from __future__ import annotations

import pytest

from tests import tiny


@pytest.mark.parametrize("chunked", [False, True])
def test_iteration_outputs_match_cache_free_greedy(chunked: bool) -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(7, 2, 30, seed=1)
    max_tokens = [5, 1, 9, 3, 12, 2, 6]
    requests = tiny.make_requests(prompts, max_tokens)
    engine = tiny.make_engine(
        model,
        tiny.strategy("iteration", chunked_prefill=chunked),
        kv_slots=600,
        max_num_seqs=4,
        max_num_batched_tokens=16 if chunked else 64,
    )
    records = tiny.serve(engine, requests)
    for request, prompt, count in zip(requests, prompts, max_tokens, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, count), request.id
    budget = 16 if chunked else 64
    assert all(r["prefill_tokens"] + r["decode_tokens"] <= budget for r in records)
    assert max(r["num_seqs"] for r in records) <= 4


def test_finished_request_leaves_and_waiting_one_joins_the_next_step() -> None:
    model = tiny.tiny_model()
    requests = tiny.make_requests(tiny.random_prompts(3, 5, 5), [1, 6, 2])
    records = tiny.serve(
        tiny.make_engine(model, tiny.strategy("iteration"), kv_slots=100, max_num_seqs=2), requests
    )
    # step 0: prefill of 0 and 1; 0 finishes at once. step 1: 1 decodes, 2 joins with its prefill.
    assert [r["num_seqs"] for r in records[:3]] == [2, 2, 2]
    assert records[1]["prefill_tokens"] == 5 and records[1]["decode_tokens"] == 1
    assert requests[2].token_times[0] < requests[1].token_times[-1]


def test_chunked_prefill_splits_long_prompts_and_decodes_go_first() -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(1, 4, 4, seed=2) + tiny.random_prompts(1, 20, 20, seed=3)
    requests = tiny.make_requests(prompts, [6, 3])
    engine = tiny.make_engine(
        model,
        tiny.strategy("iteration", chunked_prefill=True),
        kv_slots=200,
        max_num_batched_tokens=8,
    )
    records = tiny.serve(engine, requests)
    # step 0: first prompt (4) + 4 tokens of the long prompt; then 1 decode + 7 prompt tokens ...
    assert [(r["prefill_tokens"], r["decode_tokens"]) for r in records[:4]] == [
        (8, 0),
        (7, 1),
        (7, 1),
        (2, 1),
    ]
    # the long request samples only after its last chunk (step 3)
    assert len(requests[1].token_times) == 3
    assert requests[1].output_ids == tiny.greedy_reference(model, prompts[1], 3)
