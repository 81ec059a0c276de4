"""`strategy.policy=prefix_first`: the waiting request with the longest cached prefix goes first."""

from __future__ import annotations

from tests.tiny import greedy_reference, make_engine, make_requests, serve, strategy, tiny_model


def _serve(policy: str, kv: str = "paged") -> tuple[list[str], int]:
    model = tiny_model()
    shared = [21] * 12  # three blocks of 4
    prompts = [shared + [5, 6], [30 + i for i in range(13)], shared + [7, 8]]
    requests = make_requests(prompts, [3, 3, 3])
    settings = strategy("iteration", kv, policy=policy, prefix_caching=True, block_size=4)
    engine = make_engine(model, settings, kv_slots=20, max_num_seqs=1)  # five blocks
    records = serve(engine, requests)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, 3)
    order = [r.id for r in sorted(requests, key=lambda r: r.t_admitted)]
    return order, records[-1].get("prefix_hit_tokens", 0)


def test_prefix_first_admits_the_request_that_hits_the_cache_before_an_earlier_one() -> None:
    # in arrival order the unrelated request 1 evicts most of the shared prefix first
    assert _serve("prefix_first") == (["0", "2", "1"], 12)
    assert _serve("fcfs") == (["0", "1", "2"], 4)


def test_without_a_prefix_cache_it_is_arrival_order() -> None:
    assert _serve("prefix_first", kv="contiguous")[0] == ["0", "1", "2"]
