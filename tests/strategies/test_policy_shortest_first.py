"""`strategy.policy=shortest_first`: waiting requests are admitted by prompt + max_tokens."""

from __future__ import annotations

from tests.tiny import greedy_reference, make_engine, make_requests, serve, strategy, tiny_model


def _admission_order(policy: str, batching: str) -> list[str]:
    model = tiny_model()
    prompts = [[20 + i] * n for i, n in enumerate([9, 3, 6, 3, 12])]
    requests = make_requests(prompts, [4, 8, 2, 2, 1])  # sizes 13, 11, 8, 5, 13
    engine = make_engine(model, strategy(batching, policy=policy), kv_slots=400, max_num_seqs=1)
    serve(engine, requests)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, request.sampling.max_tokens)
    return [r.id for r in sorted(requests, key=lambda r: r.t_admitted)]


def test_shortest_first_admits_the_smallest_jobs_first_and_keeps_arrival_order_on_ties() -> None:
    for batching in ("iteration", "static"):
        assert _admission_order("shortest_first", batching) == ["3", "2", "1", "0", "4"]
        assert _admission_order("fcfs", batching) == ["0", "1", "2", "3", "4"]
