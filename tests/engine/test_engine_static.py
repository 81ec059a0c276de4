"""Static batching + contiguous KV on a tiny random model: exact tokens and visible waste."""

from __future__ import annotations

from tests import tiny


def test_static_batching_matches_cache_free_greedy() -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(5, 3, 12)
    max_tokens = [6, 2, 9, 4, 7]
    requests = tiny.make_requests(prompts, max_tokens)
    tiny.serve(tiny.make_engine(model, tiny.strategy(), kv_slots=400, max_num_seqs=3), requests)
    for request, prompt, count in zip(requests, prompts, max_tokens, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, count)
        assert request.finish_reason == "length"
        assert len(request.token_times) == count


def test_padded_finished_members_keep_their_rows_and_slots_until_the_batch_ends() -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(2, 4, 4)
    requests = tiny.make_requests(prompts, [2, 8])
    records = tiny.serve(
        tiny.make_engine(model, tiny.strategy(pad_finished=True), kv_slots=100), requests
    )
    reserved = (4 + 2) + (4 + 8)
    assert [r["kv_allocated_slots"] for r in records] == [reserved] * 8
    # the short request finishes in step 1; from step 2 on its row is fed padding
    assert records[1]["kv_live_slots"] == 5 + 5
    assert records[2]["kv_live_slots"] == 6
    assert records[2]["kv_waste"] == (reserved - 6) / reserved
    assert [r["num_seqs"] for r in records] == [2] * 8
    assert [r["pad_tokens"] for r in records] == [0, 0] + [1] * 6
    assert records[0]["prefill_tokens"] == 8 and records[0]["decode_tokens"] == 0
    assert records[1]["decode_tokens"] == 2 and records[2]["decode_tokens"] == 1
    for request, prompt, count in zip(requests, prompts, [2, 8], strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, count)


def test_unpadded_finished_members_leave_the_compute_and_free_their_slab() -> None:
    # (before the switches, this was the only behaviour, and fastertransformer used it)
    model = tiny.tiny_model()
    requests = tiny.make_requests(tiny.random_prompts(2, 4, 4), [2, 8])
    records = tiny.serve(
        tiny.make_engine(model, tiny.strategy(pad_finished=False), kv_slots=100), requests
    )
    assert [r["kv_allocated_slots"] for r in records] == [18, 18] + [12] * 6
    assert [r["num_seqs"] for r in records] == [2, 2] + [1] * 6
    assert sum(r["pad_tokens"] for r in records) == 0


def test_responses_are_held_until_the_batch_ends() -> None:
    model = tiny.tiny_model()
    delivered = {}
    for return_at in ("batch_end", "own_finish"):
        requests = tiny.make_requests(tiny.random_prompts(2, 4, 4), [2, 8])
        tiny.serve(
            tiny.make_engine(model, tiny.strategy(return_at=return_at), kv_slots=100), requests
        )
        short, long = requests
        assert long.t_done == long.token_times[-1]
        delivered[return_at] = short.t_done
        assert short.t_done >= short.token_times[-1]
    # held: delivered with the long member at the batch's end, not at its own last token
    assert delivered["batch_end"] > delivered["own_finish"]
    assert delivered["own_finish"] == requests[0].token_times[-1]


def test_prompts_are_padded_to_the_longest_and_outputs_stay_exact() -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(3, 3, 11, seed=2)
    lengths = [len(p) for p in prompts]
    requests = tiny.make_requests(prompts, [4, 4, 4])
    engine = tiny.make_engine(model, tiny.strategy(pad_prompts=True), kv_slots=200)
    records = tiny.serve(engine, requests)
    width = max(lengths)
    assert records[0]["pad_tokens"] == sum(width - n for n in lengths) > 0
    assert records[0]["prefill_tokens"] == sum(lengths)
    # each member's slab is at least the padded width (the batch's rectangle)
    assert records[0]["kv_allocated_slots"] == sum(max(n + 4, width) for n in lengths)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, 4)


def test_static_batching_over_paged_kv_never_deadlocks_on_a_held_member() -> None:
    # two 4-token prompts, max_tokens 2 and 12, 16 slots of paged KV in blocks of 4: the
    # long member cannot grow while the finished one holds its blocks. (Before: it preempted
    # itself, the finished member never freed its blocks, and the run died with
    # "unfinished requests but scheduled none".)
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(2, 4, 4, seed=3)
    for pad_finished in (True, False):
        requests = tiny.make_requests(prompts, [2, 12])
        settings = tiny.strategy(kv="paged", block_size=4, pad_finished=pad_finished)
        engine = tiny.make_engine(model, settings, kv_slots=16)
        tiny.serve(engine, requests, check=lambda e: e.scheduler.kv.check_integrity())
        for request, prompt, count in zip(requests, prompts, [2, 12], strict=True):
            assert request.output_ids == tiny.greedy_reference(model, prompt, count)
        assert engine.kv.pool.num_free + engine.kv.pool.num_cached == 4


def test_second_batch_waits_for_the_whole_first_batch() -> None:
    model = tiny.tiny_model()
    requests = tiny.make_requests(tiny.random_prompts(3, 5, 5), [1, 6, 1])
    records = tiny.serve(
        tiny.make_engine(model, tiny.strategy(), kv_slots=100, max_num_seqs=2), requests
    )
    # the third request starts only after the 6-token member finished: 6 steps, then 1
    assert [r["num_seqs"] for r in records] == [2, 1, 1, 1, 1, 1, 1]
    assert records[0]["waiting"] == 1 and records[-1]["waiting"] == 0


def test_static_batching_over_paged_kv_preempts_and_stays_exact() -> None:
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(4, 6, 10, seed=4)
    requests = tiny.make_requests(prompts, [12, 12, 12, 12])
    engine = tiny.make_engine(
        model, tiny.strategy(kv="paged", block_size=4), kv_slots=48, max_num_seqs=4
    )
    records = tiny.serve(engine, requests, check=lambda e: e.scheduler.kv.check_integrity())
    assert sum(r["preempted"] for r in records) > 0
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, 12)
