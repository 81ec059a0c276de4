"""Speculative decoding in the real engine on tiny random models: exactly the greedy tokens.

A 16-token vocabulary makes prompt lookup find matches and drafts fail often, so rollback
runs all the time. Every run checks after every step that both the target's and the
drafter's paged caches keep their integrity and that their prefix caches hold only verified
tokens, and checks every output against the cache-free greedy reference (fp32).
"""

from __future__ import annotations

import pytest
import torch

from servelab.base.records import StepRecord
from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.harness.measure.metrics import speculative_summary
from servelab.models.model import LlamaModel
from servelab.strategies.decoding.model_drafter import ModelDrafter
from servelab.strategies.kv.paged import PagedKVManager
from servelab.strategies.settings import StrategySettings
from tests import tiny

VOCAB = 16
PROPOSERS = ("ngram", "layerskip", "draft")


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny.tiny_model(vocab_size=VOCAB)


@pytest.fixture(scope="module")
def draft_model() -> LlamaModel:
    """The target's weights plus noise: a draft that agrees often, not always."""
    drafted = tiny.tiny_model(vocab_size=VOCAB)
    noise = tiny.tiny_model(seed=1, scale=0.1, vocab_size=VOCAB)
    with torch.no_grad():
        for mine, extra in zip(drafted.parameters(), noise.parameters(), strict=True):
            if mine.dim() > 1:
                mine.add_(extra)
    return drafted


def _spec(batching: str, kv: str, proposer: str, **overrides) -> StrategySettings:
    return tiny.strategy(
        batching,
        kv,
        decoding="speculative",
        proposer=proposer,
        layerskip_layers=1,
        **{"gamma": 3, "prefix_caching": kv == "paged", **overrides},
    )


def _only_verified(kv: object, requests: list[Request]) -> None:
    if not isinstance(kv, PagedKVManager):
        return
    kv.check_integrity()
    sequences = [tuple(r.all_token_ids()) for r in requests]
    for prefix in kv.prefix_cache.prefixes():
        assert any(s[: len(prefix)] == prefix for s in sequences), prefix


def _checker(requests: list[Request]):
    def check(engine: Engine) -> None:
        _only_verified(engine.kv, requests)
        proposer = getattr(engine.decoder, "proposer", None)
        if isinstance(proposer, ModelDrafter):
            _only_verified(proposer.kv, requests)

    return check


def _assert_greedy(model: LlamaModel, requests: list[Request], prompts, counts) -> None:
    for request, prompt, count in zip(requests, prompts, counts, strict=True):
        assert request.output_ids == tiny.greedy_reference(model, prompt, count), request.id


@pytest.mark.parametrize("proposer", PROPOSERS)
@pytest.mark.parametrize("batching", ["static", "iteration"])
@pytest.mark.parametrize("kv", ["contiguous", "paged"])
def test_speculation_serves_exactly_the_greedy_tokens(
    model: LlamaModel, draft_model: LlamaModel, proposer: str, batching: str, kv: str
) -> None:
    prompts = tiny.random_prompts(6, 3, 20, seed=1, vocab_size=VOCAB)
    counts = [12, 20, 7, 16, 30, 9]
    requests = tiny.make_requests(prompts, counts)
    engine = tiny.make_engine(
        model,
        _spec(batching, kv, proposer),
        kv_slots=600,
        max_num_seqs=4,
        draft_model=draft_model if proposer == "draft" else None,
    )
    steps = tiny.serve(engine, requests, _checker(requests))
    _assert_greedy(model, requests, prompts, counts)
    proposed = sum(s["spec_proposed"] for s in steps)
    accepted = sum(s["spec_accepted"] for s in steps)
    assert 0 < accepted < proposed  # some drafts pass, some are rolled back
    for request in requests:  # every token after the first came from a counted forward
        assert len(request.output_ids) == 1 + request.counters["spec_emitted"]


@pytest.mark.parametrize(
    ("proposer", "preemption"), [*((p, "recompute") for p in PROPOSERS), ("ngram", "swap")]
)
def test_speculation_stays_exact_under_preemption_prefix_hits_and_chunked_prefill(
    model: LlamaModel, draft_model: LlamaModel, proposer: str, preemption: str
) -> None:
    shared = tiny.random_prompts(2, 12, 12, seed=4, vocab_size=VOCAB)
    tails = tiny.random_prompts(8, 2, 9, seed=5, vocab_size=VOCAB)
    prompts = [shared[i % 2] + tail for i, tail in enumerate(tails)]
    counts = [14, 9, 20, 6, 17, 11, 8, 15]
    requests = tiny.make_requests(prompts, counts)
    engine = tiny.make_engine(
        model,
        _spec("iteration", "paged", proposer, chunked_prefill=True, preemption=preemption),
        kv_slots=96,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        draft_model=draft_model if proposer == "draft" else None,
    )
    steps = tiny.serve(engine, requests, _checker(requests))
    _assert_greedy(model, requests, prompts, counts)
    assert sum(s["preempted"] for s in steps) > 0
    assert steps[-1]["prefix_hit_tokens"] > 0
    assert all(s["prefill_tokens"] + s["decode_tokens"] <= 24 for s in steps)
    assert sum(s["spec_accepted"] for s in steps) > 0
    proposer_state = engine.decoder.proposer
    if isinstance(proposer_state, ModelDrafter):  # every shadow released, every block back
        assert proposer_state.kv.pool.num_used == 0


def test_a_target_drafting_for_itself_has_every_draft_accepted() -> None:
    """The drafter's own cache, rollback and catch-up are right only if it predicts exactly
    what the target computes; any slip in them shows as a rejected draft."""
    model = tiny.tiny_model()
    prompts = tiny.random_prompts(5, 3, 25, seed=2)
    counts = [17, 5, 26, 11, 9]
    requests = tiny.make_requests(prompts, counts)
    engine = tiny.make_engine(
        model,
        _spec("iteration", "paged", "draft", gamma=4, block_size=4),
        kv_slots=400,
        draft_model=model,
    )
    steps = tiny.serve(engine, requests, _checker(requests))
    _assert_greedy(model, requests, prompts, counts)
    figures = speculative_summary([StepRecord.from_json(s) for s in steps])
    assert figures["spec_proposed"] > 0
    assert figures["acceptance_rate"] == 1.0
    assert figures["acceptance_histogram"][0] == 0
    assert figures["acceptance_histogram"][4] > 0  # 4 drafts, all passed (fewer near the end)


def test_drafts_are_cut_to_the_token_budget_and_counted_in_it(model: LlamaModel) -> None:
    prompts = tiny.random_prompts(4, 4, 6, seed=3, vocab_size=VOCAB)
    counts = [20, 20, 20, 20]
    requests = tiny.make_requests(prompts, counts)
    engine = tiny.make_engine(
        model,
        _spec("iteration", "contiguous", "ngram", gamma=6),
        kv_slots=200,
        max_num_batched_tokens=10,
    )
    steps = tiny.serve(engine, requests)
    _assert_greedy(model, requests, prompts, counts)
    assert all(s["prefill_tokens"] + s["decode_tokens"] <= 10 for s in steps)
    decoding = [s for s in steps if s["prefill_tokens"] == 0]
    assert all(s["num_seqs"] == s["running"] for s in decoding)  # drafts never crowd one out
    assert any(s["decode_tokens"] == 10 and s["spec_proposed"] == 6 for s in decoding)


def test_the_drafter_cache_takes_its_share_of_the_budget(model: LlamaModel) -> None:
    plain = tiny.make_engine(model, tiny.strategy("iteration", "paged"), kv_slots=96)
    layerskip = tiny.make_engine(model, _spec("iteration", "paged", "layerskip"), kv_slots=96)
    drafter = layerskip.decoder.proposer
    assert isinstance(drafter, ModelDrafter)
    assert drafter.runner.cache.num_slots == layerskip.runner.cache.num_slots
    # one of the tiny model's two layers drafts: a token costs 1.5x, so 2/3 of the slots
    assert plain.runner.cache.num_slots == 96
    assert layerskip.runner.cache.num_slots == 64
    assert layerskip.runner.cache.nbytes + drafter.runner.cache.nbytes <= plain.runner.cache.nbytes


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_sampled_outputs_do_not_depend_on_batch_composition(
    model: LlamaModel, draft_model: LlamaModel, proposer: str
) -> None:
    prompts = tiny.random_prompts(5, 4, 12, seed=6, vocab_size=VOCAB)

    def sampled(count: int) -> list[Request]:
        requests = [
            Request(str(i), prompt, SamplingParams(15, temperature=0.8, top_k=12, seed=i))
            for i, prompt in enumerate(prompts[:count])
        ]
        engine = tiny.make_engine(
            model,
            _spec("iteration", "paged", proposer),
            kv_slots=400,
            draft_model=draft_model if proposer == "draft" else None,
        )
        tiny.serve(engine, requests)
        return requests

    alone = sampled(1)[0]
    together = sampled(5)[0]
    assert together.output_ids == alone.output_ids
    assert together.counters["spec_proposed"] > 0


def test_a_cancelled_request_gives_its_drafter_cache_back(
    model: LlamaModel, draft_model: LlamaModel
) -> None:
    prompts = tiny.random_prompts(3, 5, 12, seed=7, vocab_size=VOCAB)
    requests = tiny.make_requests(prompts, [20, 20, 20])
    engine = tiny.make_engine(
        model, _spec("iteration", "paged", "draft"), kv_slots=300, draft_model=draft_model
    )
    for request in requests:
        engine.add_request(request)
    while len(requests[1].output_ids) < 4:
        engine.step()
    drafter = engine.decoder.proposer
    assert isinstance(drafter, ModelDrafter)
    held = drafter.kv.pool.num_used
    assert engine.cancel(requests[1])
    assert drafter.kv.pool.num_used < held
    while engine.has_unfinished():
        engine.step()
    _assert_greedy(model, requests[::2], prompts[::2], [20, 20])
    assert drafter.kv.pool.num_used == 0
