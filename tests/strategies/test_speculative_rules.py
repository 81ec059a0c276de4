"""The pieces of speculative decoding on their own: prompt lookup, the acceptance rules, gamma."""

from __future__ import annotations

import pytest
import torch

from servelab.engine.request import Request, SamplingParams
from servelab.engine.sampler import draw, generator_for, probabilities, sample
from servelab.strategies.decoding.acceptance import accept_greedy, accept_sampled
from servelab.strategies.decoding.gamma import choose_gamma, expected_speedup
from servelab.strategies.decoding.ngram import lookup


def test_lookup_prefers_the_longest_suffix_then_the_most_recent_occurrence() -> None:
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [7, 1, 2, 3, 9, 2, 3, 4, 5, 1, 2, 3]
    # suffix [1, 2, 3] occurs at 1 (followed by 9, 2, 3, 4); [2, 3] alone more recently at 5
    assert lookup(tokens, 3, 1, 3) == [9, 2, 3]
    assert lookup(tokens, 3, 1, 2) == [4, 5, 1]  # longest tried is 2: most recent [2, 3]
    assert lookup(tokens, 8, 1, 3) == [9, 2, 3, 4, 5, 1, 2, 3]  # up to gamma, to the end


def test_lookup_never_matches_the_suffix_itself_and_respects_the_shortest_length() -> None:
    assert lookup([1, 2, 3, 4], 4, 1, 3) == []
    assert lookup([5, 1, 2, 6, 2], 4, 1, 3) == [6, 2]  # only the 1-gram [2] recurs
    assert lookup([5, 1, 2, 6, 2], 4, 2, 3) == []
    assert lookup([3], 4, 1, 3) == []
    assert lookup([4, 4, 4], 2, 1, 3) == [4]  # [4, 4] at 0 is followed by the last 4


def _logits(*best: int, vocab: int = 8) -> torch.Tensor:
    rows = torch.zeros(len(best), vocab)
    for row, token in zip(rows, best, strict=True):
        row[token] = 5.0
    return rows


def test_greedy_acceptance_keeps_drafts_while_they_are_the_argmax() -> None:
    assert accept_greedy(_logits(3, 4, 5, 6), [3, 4, 5]) == [3, 4, 5, 6]  # all, then bonus
    assert accept_greedy(_logits(3, 4, 5, 6), [3, 1, 5]) == [3, 4]  # stop at the mismatch
    assert accept_greedy(_logits(3, 4, 5, 6), [2, 4, 5]) == [3]
    assert accept_greedy(_logits(3), []) == [3]


def _params(seed: int = 0, **kwargs) -> SamplingParams:
    return SamplingParams(max_tokens=8, temperature=1.0, seed=seed, **kwargs)


def test_sampled_acceptance_without_drafts_draws_exactly_what_plain_sampling_draws() -> None:
    logits = torch.randn(1, 32, generator=torch.Generator().manual_seed(0))
    for seed in range(20):
        request = Request("r", [1], _params(seed, top_k=10, top_p=0.9), output_ids=[4, 5])
        assert accept_sampled(logits, [], None, request.sampling, 2) == sample(logits, [request])


def test_a_draft_the_target_cannot_sample_is_always_rejected_and_never_redrawn() -> None:
    logits = torch.zeros(2, 8)
    logits[:, 3] = -1e9  # the target gives token 3 no mass at all
    for seed in range(50):
        tokens = accept_sampled(logits, [3], None, _params(seed), 0)
        assert len(tokens) == 1 and tokens[0] != 3


def test_a_certain_draft_of_a_certain_target_is_always_accepted_with_a_bonus() -> None:
    logits = _logits(2, 6) * 100
    for seed in range(20):
        assert accept_sampled(logits, [2], None, _params(seed), 0) == [2, 6]


def test_the_residual_draw_uses_max_zero_p_minus_q() -> None:
    # p = (0.5, 0.5, 0, ...), q = (1, 0, ...): a rejected draft 0 leaves only token 1
    logits = torch.full((2, 8), -1e9)
    logits[0, :2] = 0.0
    q = torch.zeros(1, 8)
    q[0, 0] = 1.0
    outcomes = {tuple(accept_sampled(logits, [0], q, _params(seed), 0)[:1]) for seed in range(64)}
    assert outcomes == {(0,), (1,)}


def test_sampled_acceptance_is_reproducible_and_keyed_by_output_index() -> None:
    logits = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    q = torch.softmax(torch.randn(3, 16, generator=torch.Generator().manual_seed(2)), -1)
    drafts = [int(draw(row, generator_for(_params(5), i, 1))) for i, row in enumerate(q)]
    first = accept_sampled(logits, drafts, q, _params(5), 7)
    assert accept_sampled(logits, drafts, q, _params(5), 7) == first
    assert probabilities(logits[0], _params(5)).sum() == pytest.approx(1.0)


def test_gamma_is_capped_by_what_the_request_may_still_emit() -> None:
    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=5), output_ids=[4, 5])
    request.num_computed_tokens = 4
    assert choose_gamma(request, "fixed", 4, 0.0, 100) == 2  # 3 more tokens: 2 drafts + 1
    assert choose_gamma(request, "fixed", 4, 0.0, 7) == 1  # the context holds 2 more
    request.num_computed_tokens = 3  # its last token and one before it are not computed
    assert choose_gamma(request, "fixed", 4, 0.0, 100) == 0


def test_adaptive_gamma_follows_the_running_acceptance_rate() -> None:
    request = Request("r", [1], SamplingParams(max_tokens=64), output_ids=[2])
    request.num_computed_tokens = 1
    assert choose_gamma(request, "adaptive", 8, 0.1, 100) == 2  # prior 1/2
    request.counters.update(spec_proposed=98, spec_accepted=88)  # rate 0.89
    assert choose_gamma(request, "adaptive", 8, 0.1, 100) == 8
    request.counters.update(spec_proposed=98, spec_accepted=2)  # rate 0.03
    assert choose_gamma(request, "adaptive", 8, 0.1, 100) == 1
    assert expected_speedup(0.5, 2, 0.1) == pytest.approx(1.75 / 1.2)
    assert expected_speedup(1.0, 3, 0.0) == 4.0
