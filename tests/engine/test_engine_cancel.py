"""Cancelling a request (its client went away) on the tiny model: wherever it is, it leaves the
scheduler, its KV returns to the cache, and every other request's tokens stay exact."""

from __future__ import annotations

import pytest

from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.models.model import LlamaModel
from tests.tiny import (
    greedy_reference,
    make_engine,
    make_requests,
    random_prompts,
    strategy,
    tiny_model,
)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model()


def _step_until(engine: Engine, done, limit: int = 100) -> None:
    for _ in range(limit):
        if done():
            return
        engine.step()
        check = getattr(engine.kv, "check_integrity", None)
        if check is not None:
            check()
    raise AssertionError("condition not reached")


def _finish(engine: Engine) -> None:
    _step_until(engine, lambda: not engine.has_unfinished())


def _assert_exact(model: LlamaModel, requests: list[Request], prompts, counts) -> None:
    for request, prompt, count in zip(requests, prompts, counts, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, count), request.id


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
def test_cancel_running_and_waiting_frees_their_kv(model: LlamaModel, kv: str) -> None:
    prompts = random_prompts(4, 5, 19, seed=3)
    counts = [8, 12, 6, 9]
    requests = make_requests(prompts, counts)
    engine = make_engine(
        model, strategy("iteration", kv, prefix_caching=False), kv_slots=256, max_num_seqs=2
    )
    for request in requests:
        engine.add_request(request)
    running, waiting = requests[1], requests[3]
    _step_until(engine, lambda: len(running.output_ids) >= 3)
    assert engine.kv.holds(running) and not engine.kv.holds(waiting)
    assert engine.cancel(running) and engine.cancel(waiting)
    assert (running.finish_reason, waiting.finish_reason) == ("cancelled", "cancelled")
    assert running.t_done is not None and not engine.kv.holds(running)
    _finish(engine)
    kept = [0, 2]
    _assert_exact(model, [requests[i] for i in kept], [prompts[i] for i in kept], [8, 6])
    stats = engine.kv.stats()
    assert (stats.allocated_slots, stats.live_slots) == (0, 0)
    assert len(running.output_ids) < counts[1] and waiting.output_ids == []


def test_cancel_after_delivery_changes_nothing(model: LlamaModel) -> None:
    requests = make_requests(random_prompts(1, 6, 6, seed=4), [3])
    engine = make_engine(model, strategy("iteration", "paged"), kv_slots=64)
    engine.add_request(requests[0])
    _finish(engine)
    assert not engine.cancel(requests[0])
    assert requests[0].finish_reason == "length"


def test_cancel_a_held_member_of_a_static_batch(model: LlamaModel) -> None:
    """Static batching holding responses to the batch end: a member that finished early but
    whose response is still held can be cancelled; the others are delivered at the end."""
    prompts = random_prompts(3, 4, 9, seed=5)
    counts = [2, 7, 5]
    requests = make_requests(prompts, counts)
    settings = strategy("static", "contiguous", return_at="batch_end", pad_finished=True)
    engine = make_engine(model, settings, kv_slots=128)
    for request in requests:
        engine.add_request(request)
    early = requests[0]
    _step_until(engine, lambda: early.is_finished)
    assert early.t_done is None  # held
    assert engine.cancel(early) and early.finish_reason == "cancelled"
    delivered = []
    while engine.has_unfinished():
        result = engine.step()
        delivered += result.delivered if result else []
    assert delivered == requests[1:]
    _assert_exact(model, requests[1:], prompts[1:], counts[1:])
    assert engine.kv.stats().allocated_slots == 0


def test_cancel_a_request_swapped_out_by_preemption(model: LlamaModel) -> None:
    prompts = random_prompts(3, 12, 12, seed=6)
    counts = [20, 20, 20]
    requests = make_requests(prompts, counts)
    settings = strategy("iteration", "paged", preemption="swap", block_size=4)
    engine = make_engine(model, settings, kv_slots=64, max_num_seqs=3)
    for request in requests:
        engine.add_request(request)
    _step_until(engine, lambda: any(r.preemptions for r in requests))
    victim = next(r for r in requests if r.preemptions)
    kv = engine.kv
    assert victim in kv._swapped  # a step that preempts admits nothing: it waits, swapped out
    assert engine.cancel(victim) and not kv.holds(victim)
    _finish(engine)
    kept = [r for r in requests if r is not victim]
    _assert_exact(model, kept, [prompts[requests.index(r)] for r in kept], [20, 20])
    kv.check_integrity()
    assert kv.pool.num_used == 0


def test_cancel_the_last_unfinished_member_of_a_static_batch_ends_it(model: LlamaModel) -> None:
    """Shrunk from the random-load property test: static batching delivering at each
    member's own finish, one member finished and delivered, the other cancelled, nothing
    waiting. The batch is over then; before the fix the engine still had "unfinished" work
    whose next step ran nothing and delivered nothing (the server's engine loop stops on
    exactly that), and a request arriving next waited behind the dead batch for a step."""
    prompts = random_prompts(3, 4, 6, seed=7)
    counts = [1, 9, 3]
    requests = make_requests(prompts, counts)
    engine = make_engine(model, strategy("static", "contiguous"), kv_slots=128, max_num_seqs=2)
    for request in requests[:2]:
        engine.add_request(request)
    _step_until(engine, lambda: requests[0].t_done is not None)
    assert engine.cancel(requests[1])
    assert not engine.has_unfinished()
    assert engine.kv.stats().allocated_slots == 0
    engine.add_request(requests[2])
    _finish(engine)
    _assert_exact(model, requests[2:], prompts[2:], counts[2:])
