"""How much of a run's prompts a prefix cache served, and how much of that the run did not
fill itself.

A server with prefix caching (vLLM, SGLang, servelab's paged strategies) keeps the KV of the
prompts it served, so a second run of the same seeded workload finds its prompts cached and
measures warm prefills, with nothing in the run saying so. Each request's record holds
`cached_prompt_tokens`: counted by the engine in this process, or reported by the server
(`usage.prompt_tokens_details.cached_tokens`: vLLM, SGLang, the OpenAI API, `servelab serve`;
llama.cpp's `timings.cache_n`), the record's `counters["cached_tokens_from"]` saying which; a
server that reports neither leaves it unknown (None there). An endpoint run also records per
request the longest prefix its prompt shares with a prompt that arrived before it in the run
(`counters["prefix_in_run"]`): the most the run itself could have put in the cache for it. What
a request found cached beyond that was in the cache before the run began: an earlier run's.
The summary gives both shares of the prompt tokens (`cached_prompt_share`, `warm_cache_share`);
`flags` flags the second past its bound. `workload.cache_bust` makes a repeat cold.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from servelab.base.records import RequestRecord

CACHED_FROM = "cached_tokens_from"  # a counter: where a server's cached count came from
PREFIX_IN_RUN = "prefix_in_run"  # a counter: the prompt's longest prefix shared earlier


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def prefixes_in_run(prompts: Sequence[Sequence[int]]) -> list[int]:
    """For each prompt, in arrival order, the longest prefix it shares with any earlier one
    (in sorted order the longest common prefix is with a neighbour)."""
    seen: list[tuple[int, ...]] = []
    shared = []
    for prompt in prompts:
        key = tuple(prompt)
        at = bisect.bisect_left(seen, key)
        neighbours = seen[max(at - 1, 0) : at + 1]
        shared.append(max((_common(key, other) for other in neighbours), default=0))
        seen.insert(at, key)
    return shared


def cached_known(record: RequestRecord) -> bool:
    """Whether the record's cached count is known: the engine's, or its server's report."""
    return record.counters.get(CACHED_FROM, "engine") is not None


def prompt_cache_summary(records: Sequence[RequestRecord]) -> dict[str, float | None]:
    """The share of the prompt tokens served from a prefix cache, over the requests whose
    count is known, and the share served from a cache this run did not fill (where the run
    recorded each prompt's prefix shared within it); None where nothing says."""
    known = [r for r in records if cached_known(r)]
    tokens = sum(r.prompt_len for r in known)
    cached = sum(min(r.cached_prompt_tokens, r.prompt_len) for r in known)
    traced = [r for r in known if PREFIX_IN_RUN in r.counters]
    warm = sum(
        max(min(r.cached_prompt_tokens, r.prompt_len) - int(r.counters[PREFIX_IN_RUN]), 0)
        for r in traced
    )
    traced_tokens = sum(r.prompt_len for r in traced)
    return {
        "cached_prompt_share": cached / tokens if tokens else None,
        "warm_cache_share": warm / traced_tokens if traced_tokens else None,
    }
