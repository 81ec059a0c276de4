"""Steps of a chosen shape, fed to the model runner on requests made up for them: what the
step profiler times (`harness.run.simulate.profile`) and what the warm-up runs before a measured
window (`harness.run.warmup`).

A shape is `rows` sequences that each feed `new_tokens` tokens after `cached` tokens already
in the KV cache: a prefill chunk (one sequence, many tokens, after an empty or a filled
cache) or a decode batch (many sequences, one token each, at a context length). Each is fed
on requests made up for it (random token ids; slots taken from the KV manager and given back
after, nothing registered as computed) and its logits are accepted by the decoder, as a
step's are; `ShapeRunner.run` returns each forward's time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from servelab.engine.decoding import Decoder, Verification
from servelab.engine.kv_manager import KVManager
from servelab.engine.model_runner import Feed, Runner
from servelab.engine.request import Request, SamplingParams

PREFILL = "prefill"
DECODE = "decode"


@dataclass(frozen=True)
class Shape:
    """`rows` sequences, each feeding `new_tokens` tokens after `cached` computed ones."""

    kind: str  # prefill | decode
    rows: int
    new_tokens: int
    cached: int

    @property
    def context(self) -> int:
        """Each sequence's context after the step."""
        return self.cached + self.new_tokens

    def feed(self, requests: list[Request]) -> Feed:
        """What the step feeds for `requests` (one per row, each holding `context` tokens)."""
        return Feed(
            requests=requests,
            starts=[self.cached] * self.rows,
            counts=[self.new_tokens] * self.rows,
            ids=[t for r in requests for t in r.prompt_ids[self.cached :]],
            logits_rows=[(row + 1) * self.new_tokens - 1 for row in range(self.rows)],
        )


class NoRoom(RuntimeError):
    """The KV cache cannot hold every row of a shape at once."""


class ShapeRunner:
    """Feeds shapes through `runner` over `kv`, accepting with `decoder` as a step does."""

    def __init__(
        self,
        runner: Runner,
        kv: KVManager,
        decoder: Decoder,
        vocab_size: int,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.decoder = decoder
        self.vocab_size = vocab_size
        self.random = random.Random(seed)
        self.clock = clock
        self.made = 0  # requests made up so far

    def run(self, shape: Shape, repeats: int, warmup: int) -> tuple[Feed, list[float]]:
        """The feed, and the seconds of each of `repeats` forwards after `warmup` untimed;
        `NoRoom` (nothing held) when the KV cache cannot hold every row at once."""
        requests: list[Request] = []
        try:
            for _ in range(shape.rows):
                requests.append(self._admitted(shape))
            feed = shape.feed(requests)
            due = [Verification(request, 0) for request in requests]
            for request in requests:
                request.num_computed_tokens = shape.cached
            for _ in range(warmup):
                self._forward(feed, due)
            samples = [self._forward(feed, due) for _ in range(repeats)]
        finally:
            for request in requests:
                request.num_computed_tokens = 0  # nothing was computed for the KV manager
                self.kv.free(request)
        return feed, samples

    def _admitted(self, shape: Shape) -> Request:
        """A request of `context` random tokens, slots held for all of them."""
        self.made += 1
        prompt = [self.random.randrange(self.vocab_size) for _ in range(shape.context)]
        request = Request(str(self.made), prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        if not self.kv.admit(request):
            raise NoRoom(f"the KV cache has no room for a row of {shape}")
        if not self.kv.grow(request, shape.context):
            self.kv.free(request)
            raise NoRoom(f"the KV cache has no room for a row of {shape}")
        return request

    def _forward(self, feed: Feed, due: list[Verification]) -> float:
        start = self.clock()
        self.decoder.accept(self.runner.run(self.kv, feed), due)
        return self.clock() - start
