"""Random load for the engine: the scenarios hypothesis draws, and a driver that plays one
against a real engine on the tiny model, checking the invariants after every event and step.

A scenario is one strategy (batching, KV manager, block size, prefix caching, preemption
mode, admission policy, static batching's switches, standard or speculative decoding with
prompt-lookup drafts), the engine's limits (KV slots, requests
per step, tokens per step) and a timeline of what happens between engine steps: arrivals
(prompts made of shared prefixes and tokens from a small alphabet, so that the prefix cache
finds whole and partial matches), client cancellations, and rollbacks of computed positions
(`KVManager.truncate`, what speculative decoding does itself when drafts are rejected). After
every event and every step the driver checks that the KV manager accounts for every block or
slot exactly once, that every request is in exactly one place (queued, running, or ended
once), that no ended request still holds KV, and that every delivered response carries
exactly the greedy tokens of the cache-free reference.

The model has a 16-token vocabulary, so prompt lookup finds matches and drafts are often
rejected. Its logits are well separated but not always: where the reference's two best
logits are closer than `TIE` (fp32 summation order decides such a tie), either token is
accepted and the check goes on from the token the engine chose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

from servelab.base.batch import ForwardBatch
from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.models.model import LlamaModel
from servelab.strategies.batching.base import QueueScheduler
from tests.tiny import dense_attention, make_engine, strategy

VOCAB = 16
TOKENS = st.integers(3, 10)  # a small alphabet: accidental shared prefixes are common
MAX_TOKENS = 8
TIE = 1e-4  # logits closer than this are a tie fp32 rounding may break either way
MAX_STEPS = 2000  # far beyond what any scenario needs: reaching it means a livelock
STOP = 2  # the tiny model's end-of-sequence token


@dataclass(frozen=True)
class Arrival:
    step: int  # engine steps run before it arrives
    prefix: int  # index of the shared prefix its prompt starts with
    tail: tuple[int, ...]
    max_tokens: int
    ignore_eos: bool


@dataclass(frozen=True)
class Cancel:
    step: int
    target: int  # index of the arrival whose client goes away (ignored before it arrives)


@dataclass(frozen=True)
class Rollback:
    step: int
    target: int  # which running request, modulo how many run
    back: int  # computed positions to drop


@dataclass(frozen=True)
class Scenario:
    batching: str
    kv: str
    options: tuple[tuple[str, object], ...]  # strategy keys beyond batching and kv
    kv_slots: int
    max_num_seqs: int
    max_num_batched_tokens: int
    prefixes: tuple[tuple[int, ...], ...]
    arrivals: tuple[Arrival, ...]
    cancels: tuple[Cancel, ...]
    rollbacks: tuple[Rollback, ...]

    def prompt(self, arrival: Arrival) -> list[int]:
        return list(self.prefixes[arrival.prefix] + arrival.tail)

    @property
    def chunked(self) -> bool:
        return dict(self.options).get("chunked_prefill") is True


@st.composite
def scenarios(draw: st.DrawFn, batching: str, kv: str) -> Scenario:
    options: dict[str, object] = {"policy": draw(st.sampled_from(POLICIES))}
    if draw(st.booleans()):
        options["decoding"] = "speculative"
        options["proposer"] = "ngram"
        options["gamma"] = draw(st.integers(1, 4))
        options["ngram_max"] = draw(st.integers(1, 3))
    if batching == "static":
        options["return_at"] = draw(st.sampled_from(("batch_end", "own_finish")))
        options["pad_finished"] = draw(st.booleans())
        options["pad_prompts"] = draw(st.booleans())
    else:
        options["chunked_prefill"] = draw(st.booleans())
    if kv == "paged":
        options["block_size"] = draw(st.sampled_from((1, 2, 3, 4, 8)))
        options["prefix_caching"] = draw(st.booleans())
        options["preemption"] = draw(st.sampled_from(("recompute", "swap")))
    prefixes = tuple(
        draw(st.lists(st.lists(TOKENS, max_size=12).map(tuple), min_size=1, max_size=3))
    )
    arrival = st.builds(
        Arrival,
        step=st.integers(0, 12),
        prefix=st.integers(0, len(prefixes) - 1),
        tail=st.lists(TOKENS, min_size=1, max_size=10).map(tuple),
        max_tokens=st.integers(1, MAX_TOKENS),
        ignore_eos=st.booleans(),
    )
    arrivals = tuple(draw(st.lists(arrival, min_size=1, max_size=10)))
    cancel = st.builds(Cancel, step=st.integers(0, 20), target=st.integers(0, len(arrivals) - 1))
    rollback = st.builds(
        Rollback, step=st.integers(1, 20), target=st.integers(0, 7), back=st.integers(1, 12)
    )
    return Scenario(
        batching=batching,
        kv=kv,
        options=tuple(sorted(options.items())),
        kv_slots=draw(st.one_of(st.integers(8, 24), st.integers(25, 64))),
        max_num_seqs=draw(st.integers(1, 6)),
        max_num_batched_tokens=draw(st.integers(8, 48)),
        prefixes=prefixes,
        arrivals=arrivals,
        cancels=tuple(draw(st.lists(cancel, max_size=4))),
        rollbacks=tuple(draw(st.lists(rollback, max_size=6))),
    )


POLICIES = ("fcfs", "shortest_first", "prefix_first")


class References:
    """The cache-free greedy reference, one full forward per prefix, kept across examples."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}

    @torch.inference_mode()
    def next_logits(self, tokens: list[int]) -> torch.Tensor:
        key = tuple(tokens)
        if key not in self._logits:
            layers = [None] * self.model.config.num_layers
            batch = ForwardBatch.single(torch.tensor(tokens))
            self._logits[key] = self.model(batch, layers, layers, dense_attention)[0]
        return self._logits[key]

    def check(self, request: Request, max_tokens: int, ignore_eos: bool) -> None:
        """Every output token is the reference's greedy choice after the tokens before it (or
        one of a tie), and the response ends where the reference's would."""
        tokens = list(request.prompt_ids)
        for position, token in enumerate(request.output_ids):
            logits = self.next_logits(tokens)
            best = float(logits.max())
            assert float(logits[token]) >= best - TIE, (
                f"request {request.id}: output {position} is {token}, the reference's is "
                f"{int(logits.argmax())} (margin {best - float(logits[token]):.3g})"
            )
            assert ignore_eos or token != STOP or position == len(request.output_ids) - 1, (
                f"request {request.id} went on past its stop token"
            )
            tokens.append(token)
        ended_by_stop = not ignore_eos and request.output_ids[-1:] == [STOP]
        assert len(request.output_ids) == max_tokens or ended_by_stop, (
            f"request {request.id}: {len(request.output_ids)} of {max_tokens} tokens, no stop"
        )
        assert request.finish_reason == ("stop" if ended_by_stop else "length")


@dataclass
class Outcome:
    """How every arrival ended, by arrival index, and what the run did."""

    delivered: dict[int, Request] = field(default_factory=dict)
    cancelled: dict[int, Request] = field(default_factory=dict)
    rejected: dict[int, Request] = field(default_factory=dict)
    steps: int = 0
    preemptions: int = 0
    rollbacks: int = 0  # positions dropped by the scenario's own rollbacks
    drafts_rejected: int = 0  # speculative drafts the target refused (rolled back)
    prefix_hits: int = 0  # prompt tokens found in blocks other requests computed


class Driver:
    """Plays one scenario against an engine, checking every invariant as it goes."""

    def __init__(self, model: LlamaModel, scenario: Scenario, references: References) -> None:
        self.scenario = scenario
        self.references = references
        settings = strategy(scenario.batching, scenario.kv, **dict(scenario.options))
        self.engine: Engine = make_engine(
            model,
            settings,
            kv_slots=scenario.kv_slots,
            max_num_seqs=scenario.max_num_seqs,
            max_num_batched_tokens=scenario.max_num_batched_tokens,
        )
        scheduler = self.engine.scheduler
        assert isinstance(scheduler, QueueScheduler)
        self.scheduler = scheduler
        self.requests: dict[int, Request] = {}  # arrived, by arrival index
        self.live: dict[int, Request] = {}  # arrived and not ended
        self.outcome = Outcome()

    def run(self) -> Outcome:
        events = self._timeline()
        last = max(events, default=0)
        step = 0
        while step <= last or self.engine.has_unfinished():
            for event in events.get(step, []):
                event()
                self.check()
            step += 1
            if not self.engine.has_unfinished():
                continue
            self._step()
            assert self.outcome.steps < MAX_STEPS, "no end in sight: a livelock"
        self._check_drained()
        return self.outcome

    def _timeline(self) -> dict[int, list[Callable[[], None]]]:
        events: dict[int, list[Callable[[], None]]] = {}
        for index, arrival in enumerate(self.scenario.arrivals):
            events.setdefault(arrival.step, []).append(lambda i=index: self._arrive(i))
        for cancel in self.scenario.cancels:
            events.setdefault(cancel.step, []).append(lambda c=cancel: self._cancel(c))
        for rollback in self.scenario.rollbacks:
            events.setdefault(rollback.step, []).append(lambda r=rollback: self._rollback(r))
        return events

    def _arrive(self, index: int) -> None:
        arrival = self.scenario.arrivals[index]
        sampling = SamplingParams(max_tokens=arrival.max_tokens, ignore_eos=arrival.ignore_eos)
        request = Request(str(index), self.scenario.prompt(arrival), sampling)
        self.requests[index] = request
        never = self._never_fits(request)
        if self.engine.add_request(request):
            assert not never, f"request {index} was queued though it can never fit"
            self.live[index] = request
            return
        assert never, f"request {index} rejected though it fits: {request.error}"
        assert request.finish_reason == "rejected" and request.error, request.error
        assert request.t_done is not None
        self.outcome.rejected[index] = request

    def _never_fits(self, request: Request) -> bool:
        """Rejection, decided independently of the engine: more KV than the whole cache, or
        (without chunked prefill) a prompt larger than one step's token budget."""
        kv = self.engine.kv
        too_big = request.max_total_tokens > kv.total_slots
        budget = self.scenario.max_num_batched_tokens
        unsplittable = (
            self.scenario.batching == "iteration"
            and not self.scenario.chunked
            and request.prompt_len > budget
        )
        return too_big or unsplittable

    def _cancel(self, cancel: Cancel) -> None:
        request = self.requests.get(cancel.target)
        if request is None:
            return  # its client went away before it was sent
        if cancel.target not in self.live:
            state = (request.finish_reason, list(request.output_ids), request.t_done)
            assert not self.engine.cancel(request), "an ended request was cancelled again"
            assert (request.finish_reason, request.output_ids, request.t_done) == state
            return
        assert self.engine.cancel(request)
        assert request.finish_reason == "cancelled" and request.t_done is not None
        del self.live[cancel.target]
        self.outcome.cancelled[cancel.target] = request

    def _rollback(self, rollback: Rollback) -> None:
        running = [r for r in self.scheduler.running_requests() if r.num_computed_tokens > 0]
        if not running:
            return
        request = running[rollback.target % len(running)]
        keep = max(0, request.num_computed_tokens - rollback.back)
        self.engine.kv.truncate(request, keep)
        assert request.num_computed_tokens == keep
        self.outcome.rollbacks += 1

    def _step(self) -> None:
        result = self.engine.step()
        assert result is not None, "unfinished requests, but the scheduler ran nothing"
        self.outcome.steps += 1
        self.outcome.preemptions += result.record.preempted
        record = result.record
        assert 0 <= record.kv_live_slots <= record.kv_allocated_slots <= record.kv_total_slots
        for request in result.delivered:
            index = int(request.id)
            assert index in self.live, f"request {index} delivered twice, or after it ended"
            del self.live[index]
            assert request.finish_reason in ("stop", "length"), request.finish_reason
            assert request.t_done is not None
            arrival = self.scenario.arrivals[index]
            self.references.check(request, arrival.max_tokens, arrival.ignore_eos)
            self.outcome.delivered[index] = request
            self.outcome.prefix_hits += request.cached_prompt_tokens
            counters = request.counters
            rejected = counters.get("spec_proposed", 0) - counters.get("spec_accepted", 0)
            self.outcome.drafts_rejected += int(rejected)
        self.check()

    def check(self) -> None:
        """KV conserved; each live request in exactly one place; a request the scheduler no
        longer holds holds no KV. (Static batching keeps a delivered member in its batch,
        and with `pad_finished` its KV, until the batch ends.)"""
        kv = self.engine.kv
        kv.check_integrity()
        queued = list(self.scheduler.waiting) + list(self.scheduler.running)
        placed = {id(r) for r in queued}
        assert len(placed) == len(queued), "a request is queued twice"
        live = {id(r) for r in self.live.values()}
        assert live <= placed, "a request was lost"
        for request in queued:
            if id(request) not in live:
                assert request in self.scheduler.running and request.is_finished
                assert int(request.id) in self.outcome.delivered, f"{request.id} lingers"
        for request in self.scheduler.running_requests():
            assert kv.holds(request), f"running request {request.id} holds no KV"
        for request in self.requests.values():
            if id(request) not in placed:
                assert not kv.holds(request), f"ended request {request.id} still holds KV"

    def _check_drained(self) -> None:
        """Every arrival ended exactly once, and the cache is whole again."""
        outcome = self.outcome
        ended = [*outcome.delivered, *outcome.cancelled, *outcome.rejected]
        assert sorted(ended) == list(range(len(self.scenario.arrivals))), "lost or duplicated"
        assert not self.live
        stats = self.engine.kv.stats()
        assert (stats.allocated_slots, stats.live_slots) == (0, 0), "KV not returned"
