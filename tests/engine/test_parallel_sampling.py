"""Parallel sampling (n > 1) in the real engine on the tiny model.

The prompt is computed once; under paged KV the other samples share its blocks (counted),
copying a shared block only when they write into it; under contiguous KV each sample holds a
slab of its own. Every sample's tokens equal a single request with the same seed and sample
index, whichever strategy ran it, and the response is delivered once, with every sample.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.engine.sampler import DRAFT_STREAM, TARGET_STREAM, generator_for
from servelab.harness.run.replay import serve_all
from servelab.models.model import LlamaModel
from tests.tiny import greedy_reference, make_engine, random_prompts, strategy, tiny_model

PROMPT_LEN = 10  # not a multiple of the block size (4): the last prompt block is partial
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model()


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return random_prompts(1, PROMPT_LEN, PROMPT_LEN, seed=3)[0]


def _request(prompt: list[int], n: int, sample_index: int = 0, rid: str = "r") -> Request:
    sampling = SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=50.0,  # the tiny model's logits are far apart: flatten them
        ignore_eos=True,
        seed=7,
        n=n,
        sample_index=sample_index,
    )
    return Request(id=rid, prompt_ids=list(prompt), sampling=sampling)


def _check(engine: Engine) -> None:
    engine.kv.check_integrity()


STRATEGIES = {
    "orca-paged": dict(batching="iteration", kv="paged"),
    "orca-paged-prefix": dict(batching="iteration", kv="paged", prefix_caching=True),
    "orca-contiguous": dict(batching="iteration", kv="contiguous"),
    "static-contiguous": dict(batching="static", kv="contiguous"),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_each_sample_draws_what_a_single_request_with_its_index_draws(
    model: LlamaModel, prompt: list[int], name: str
) -> None:
    settings = strategy(**STRATEGIES[name])
    request = _request(prompt, 4)
    results = serve_all(make_engine(model, settings, kv_slots=256), [request], _check)
    delivered = [r for result in results for r in result.delivered]
    assert delivered == [request]  # one response, once, when the last sample is done
    samples = request.every_sample
    assert [s.id for s in samples] == ["r", "r#1", "r#2", "r#3"]
    assert [s.sampling.sample_index for s in samples] == [0, 1, 2, 3]
    assert len({s.t_done for s in samples}) == 1
    assert len({s.token_times[0] for s in samples}) == 1  # every first token from the prefill
    for index, sample in enumerate(samples):
        alone = _request(prompt, 1, sample_index=index)
        serve_all(make_engine(model, settings, kv_slots=256), [alone])
        assert sample.output_ids == alone.output_ids, sample.id
        assert len(sample.output_ids) == MAX_TOKENS
    assert len({tuple(s.output_ids) for s in samples}) > 1  # the samples do differ
    assert [r.sample_index for r in request.records()] == [0, 1, 2, 3]


def _after_prefill(model: LlamaModel, prompt: list[int], kv: str, n: int) -> tuple[Engine, Request]:
    """An orca engine over `kv` that has run the prefill step of one request for n samples."""
    engine = make_engine(model, strategy(batching="iteration", kv=kv), kv_slots=256)
    request = _request(prompt, n)
    engine.add_request(request)
    assert engine.step() is not None
    return engine, request


def test_paged_samples_share_the_prompt_blocks_and_copy_the_partial_one_on_write(
    model: LlamaModel, prompt: list[int]
) -> None:
    engine, request = _after_prefill(model, prompt, "paged", 4)
    pool = engine.kv.pool
    assert len(request.samples) == 3
    assert pool.num_used == 3  # ceil(10 / 4) blocks of prompt, held by all four samples
    assert pool.num_shared == 3
    assert all(engine.kv.block_ids(s) == engine.kv.block_ids(request) for s in request.samples)
    _check(engine)
    engine.step()  # every sample writes position 10, into the shared partial block
    assert pool.num_shared == 2  # the two full prompt blocks stay shared
    assert pool.num_used == 2 + 4  # and each sample has its own copy of the third
    _check(engine)


def test_contiguous_samples_each_hold_a_slab_with_the_prompt_copied(
    model: LlamaModel, prompt: list[int]
) -> None:
    engine, _ = _after_prefill(model, prompt, "contiguous", 3)
    stats = engine.kv.stats()
    assert stats.extra["kv_slabs"] == 3
    assert stats.allocated_slots == 3 * (PROMPT_LEN + MAX_TOKENS)
    assert stats.live_slots == 3 * PROMPT_LEN


def test_a_sample_without_room_waits_and_recomputes_its_prompt(
    model: LlamaModel, prompt: list[int]
) -> None:
    """Room for two slabs only: the third sample waits for one to free, recomputes its
    prompt (its first token already drawn) and still draws its own tokens."""
    settings = strategy(batching="iteration", kv="contiguous")
    request = _request(prompt, 3)
    engine = make_engine(model, settings, kv_slots=2 * (PROMPT_LEN + MAX_TOKENS))
    records = [r.record for r in serve_all(engine, [request], _check)]
    assert max(r.running for r in records) == 2
    late = request.samples[1]
    alone = _request(prompt, 1, sample_index=2)
    serve_all(make_engine(model, settings, kv_slots=256), [alone])
    assert late.output_ids == alone.output_ids
    assert sum(r.prefill_tokens for r in records) == PROMPT_LEN + (PROMPT_LEN + 1)


def test_greedy_samples_are_the_greedy_answer(model: LlamaModel, prompt: list[int]) -> None:
    request = Request("g", list(prompt), SamplingParams(max_tokens=5, ignore_eos=True, n=3))
    serve_all(make_engine(model, strategy(batching="iteration", kv="paged"), 256), [request])
    expected = greedy_reference(model, prompt, 5)
    assert [s.output_ids for s in request.every_sample] == [expected] * 3


def test_n_samples_take_n_places_in_the_batch(model: LlamaModel, prompt: list[int]) -> None:
    """With places for four sequences, a request for three samples and two single requests:
    the second single request waits until a place frees."""
    settings = strategy(batching="iteration", kv="paged")
    engine = make_engine(model, settings, kv_slots=256, max_num_seqs=4)
    requests = [_request(prompt, n, rid=rid) for n, rid in ((3, "a"), (1, "b"), (1, "c"))]
    for request in requests:
        engine.add_request(request)
    engine.step()
    assert engine.scheduler.num_running() == 4
    assert engine.scheduler.num_waiting() == 1
    too_many = _request(prompt, 5, rid="d")
    assert not engine.add_request(too_many)
    assert too_many.finish_reason == "rejected"
    assert "5 samples" in (too_many.error or "")


def test_cancelling_a_request_cancels_every_sample(model: LlamaModel, prompt: list[int]) -> None:
    engine = make_engine(model, strategy(batching="iteration", kv="paged"), kv_slots=256)
    request = _request(prompt, 3)
    engine.add_request(request)
    engine.step()
    assert engine.cancel(request)
    assert [s.finish_reason for s in request.every_sample] == ["cancelled"] * 3
    assert engine.kv.pool.num_used == 0
    assert not engine.has_unfinished()
    _check(engine)


def test_streams_and_sample_indices_seed_different_draws() -> None:
    """torch's CPU generator keeps only a seed's low 32 bits: streams or samples told apart in
    higher bits would draw the very same numbers (as the draft and target streams once did)."""
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    lanes = [
        generator_for(params, 0, TARGET_STREAM),
        generator_for(params, 0, DRAFT_STREAM),
        generator_for(replace(params, sample_index=1), 0, TARGET_STREAM),
        generator_for(params, 1, TARGET_STREAM),
    ]
    draws = [tuple(torch.rand(4, generator=g).tolist()) for g in lanes]
    assert len(set(draws)) == len(draws)
    again = torch.rand(4, generator=generator_for(params, 0, TARGET_STREAM)).tolist()
    assert tuple(again) == draws[0]
