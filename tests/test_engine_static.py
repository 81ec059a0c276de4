"""Static batching + contiguous KV on a tiny random model: exact tokens and visible waste."""

from __future__ import annotations

from tests.tiny import (
    greedy_reference,
    make_engine,
    make_requests,
    random_prompts,
    serve,
    strategy,
    tiny_model,
)


def test_static_batching_matches_cache_free_greedy() -> None:
    model = tiny_model()
    prompts = random_prompts(5, 3, 12)
    max_tokens = [6, 2, 9, 4, 7]
    requests = make_requests(prompts, max_tokens)
    serve(make_engine(model, strategy(), kv_slots=400, max_num_seqs=3), requests)
    for request, prompt, count in zip(requests, prompts, max_tokens, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, count)
        assert request.finish_reason == "length"
        assert len(request.token_times) == count


def test_finished_members_keep_their_slots_until_the_batch_ends() -> None:
    model = tiny_model()
    prompts = random_prompts(2, 4, 4)
    requests = make_requests(prompts, [2, 8])
    records = serve(make_engine(model, strategy(), kv_slots=100), requests)
    reserved = (4 + 2) + (4 + 8)
    assert [r["kv_allocated_slots"] for r in records] == [reserved] * 8
    # the short request finishes in step 1; from step 2 on its slots stay allocated, idle
    assert records[1]["kv_live_slots"] == 5 + 5
    assert records[2]["kv_live_slots"] == 6
    assert records[2]["kv_waste"] == (reserved - 6) / reserved
    assert records[2]["num_seqs"] == 1
    assert records[0]["prefill_tokens"] == 8 and records[0]["decode_tokens"] == 0
    assert records[1]["decode_tokens"] == 2


def test_second_batch_waits_for_the_whole_first_batch() -> None:
    model = tiny_model()
    requests = make_requests(random_prompts(3, 5, 5), [1, 6, 1])
    records = serve(make_engine(model, strategy(), kv_slots=100, max_num_seqs=2), requests)
    # the third request starts only after the 6-token member finished: 6 steps, then 1
    assert [r["num_seqs"] for r in records] == [2, 1, 1, 1, 1, 1, 1]
    assert records[0]["waiting"] == 1 and records[-1]["waiting"] == 0


def test_static_batching_over_paged_kv_preempts_and_stays_exact() -> None:
    model = tiny_model()
    prompts = random_prompts(4, 6, 10, seed=4)
    requests = make_requests(prompts, [12, 12, 12, 12])
    engine = make_engine(model, strategy(kv="paged", block_size=4), kv_slots=48, max_num_seqs=4)
    records = serve(engine, requests, check=lambda e: e.scheduler.kv.check_integrity())
    assert sum(r["preempted"] for r in records) > 0
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, 12)
