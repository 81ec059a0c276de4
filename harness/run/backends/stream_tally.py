"""Count the tokens of a streamed completion and stamp when each arrived.

A chunk's receipt time is the time of every token it carries. How many it carries is read,
in order of preference, from the chunk's `token_ids` (servelab; vLLM with
`return_token_ids`), from the growth of its running `usage.completion_tokens` (vLLM's
`continuous_usage_stats`) over the tokens already stamped, or, where a server says neither,
as one per chunk with text (llama.cpp, which sends one token per chunk and `usage` only with
the last). The
response's total comes from the server's `usage`, else from the token ids, else from
re-tokenising the text (only then). Where the per-chunk counts and the total disagree, the
tokens not accounted for are stamped at the last chunk and the record says how many. Every
request's record says which source each figure came from (`token_times_from`,
`token_count_from`), so a run whose counts were estimated is flagged. The prompt tokens the
server found in its prefix cache come from `usage.prompt_tokens_details.cached_tokens` (vLLM,
SGLang, the OpenAI API, `servelab serve`) or llama.cpp's `timings.cache_n`, and the record says
which (`prompt_cache.CACHED_FROM`; None where the server said neither).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from servelab.harness.measure.prompt_cache import CACHED_FROM

ESTIMATED_TIMES = "chunks"
ESTIMATED_COUNT = "retokenised"


@dataclass
class Settled:
    output_ids: list[int]
    token_times: list[float]
    finish_reason: str | None
    counters: dict[str, Any]
    cached_prompt_tokens: int | None  # None: the server did not say


@dataclass
class StreamTally:
    times: list[float] = field(default_factory=list)
    ids: list[int] | None = None
    text: list[str] = field(default_factory=list)
    reported: int | None = None  # the last `usage.completion_tokens` seen
    finish_reason: str | None = None
    times_from: set[str] = field(default_factory=set)
    cached: int | None = None  # prompt tokens the server found in its prefix cache
    cached_from: str | None = None

    def add(self, chunk: dict[str, Any], now: float) -> None:
        """One parsed `data:` chunk, received at `now`."""
        usage = chunk.get("usage") or {}
        total = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        for source, cached in (
            ("usage", details.get("cached_tokens")),
            ("timings", (chunk.get("timings") or {}).get("cache_n")),
        ):
            if isinstance(cached, int) and not isinstance(cached, bool):
                self.cached, self.cached_from = cached, source
        choices = chunk.get("choices") or []
        if choices:
            self._choice(choices[0], total, now)
        if total is not None:
            self.reported = int(total)

    def _choice(self, choice: dict[str, Any], total: int | None, now: float) -> None:
        piece = choice.get("text")
        if piece is None:
            piece = (choice.get("delta") or {}).get("content") or ""
        self.text.append(piece)
        ids = choice.get("token_ids")
        if ids is not None:
            self.ids = (self.ids or []) + [int(t) for t in ids]
            count, source = len(ids), "token_ids"
        elif total is not None:
            # the tokens this usage adds to those already stamped: a running usage's growth,
            # or, where usage comes only with the last chunk (llama.cpp) after chunks were
            # counted one each, just the tokens those chunks left out
            count, source = int(total) - len(self.times), "usage"
        else:
            count, source = (1 if piece else 0), ESTIMATED_TIMES
        if count > 0:
            self.times += [now] * count
            self.times_from.add(source)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def settle(self, tokenizer: PreTrainedTokenizerBase) -> Settled:
        """Output ids, one time per output token, and where the figures came from."""
        text = "".join(self.text)
        retokenised = None
        if self.ids is None or self.reported is None:
            retokenised = tokenizer.encode(text, add_special_tokens=False)
        if self.reported is not None:
            count, count_from = self.reported, "usage"
        elif self.ids is not None:
            count, count_from = len(self.ids), "token_ids"
        else:
            count, count_from = len(retokenised or []), ESTIMATED_COUNT
        ids = self.ids if self.ids is not None else list(retokenised or [])
        times = self.times[:count]
        unaccounted = count - len(times)
        if unaccounted > 0 and times:
            times += [times[-1]] * unaccounted
        counters: dict[str, Any] = {
            "token_times_from": "+".join(sorted(self.times_from)) or None,
            "token_count_from": count_from,
            "output_ids_from": "token_ids" if self.ids is not None else ESTIMATED_COUNT,
            CACHED_FROM: self.cached_from,
        }
        if count != len(self.times):
            counters["tokens_unaccounted"] = count - len(self.times)
        return Settled(ids, times, self.finish_reason, counters, self.cached)
