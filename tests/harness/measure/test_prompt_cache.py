"""The prompt tokens a prefix cache served, and those a run did not fill itself
(`harness/measure/prompt_cache.py`), and the prompts a nonce makes new to a
cache (`workloads/cache_bust.py`)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.harness.measure.flags import WARM_PREFIX_CACHE, summary_flags
from servelab.harness.measure.prompt_cache import (
    CACHED_FROM,
    PREFIX_IN_RUN,
    prefixes_in_run,
    prompt_cache_summary,
)
from servelab.workloads.build import build_workload
from servelab.workloads.cache_bust import TOKENS, busted, resolved
from servelab.workloads.corpus import special_ids
from tests.workloads.test_workloads_build import CONTEXT, preset


def record(prompt_len: int, cached: int, counters: dict) -> RequestRecord:
    return RequestRecord("r", prompt_len, 1, 0.0, [0.1], [7], "length",
                         cached_prompt_tokens=cached, counters=counters)  # fmt: skip


def test_a_prompt_shares_with_an_earlier_one_its_longest_common_prefix() -> None:
    prompts = [(1, 2, 3), (1, 2, 4), (5,), (1, 2, 3, 9), (1, 2, 3)]
    assert prefixes_in_run(prompts) == [0, 2, 0, 3, 3]


def test_cached_tokens_beyond_what_the_run_shared_came_from_a_warm_cache() -> None:
    records = [
        record(100, 64, {CACHED_FROM: "usage", PREFIX_IN_RUN: 0}),  # an earlier run's
        record(100, 64, {CACHED_FROM: "usage", PREFIX_IN_RUN: 80}),  # this run's own
        record(100, 0, {CACHED_FROM: None, PREFIX_IN_RUN: 0}),  # the server did not say
    ]
    summary = prompt_cache_summary(records)
    assert summary == {"cached_prompt_share": 0.64, "warm_cache_share": 0.32}
    flags = summary_flags(summary)
    assert [f.code for f in flags] == [WARM_PREFIX_CACHE] and "32%" in flags[0].text
    assert not summary_flags({"warm_cache_share": 0.05})
    engine = prompt_cache_summary([record(10, 4, {})])  # counted in this process
    assert engine == {"cached_prompt_share": 0.4, "warm_cache_share": None}
    unknown = prompt_cache_summary([record(10, 0, {CACHED_FROM: None})])
    assert unknown == {"cached_prompt_share": None, "warm_cache_share": None}


def test_a_nonce_is_drawn_for_true_and_refused_when_not_an_integer() -> None:
    assert resolved(None) is None and resolved(False) is None and resolved(7) == 7
    assert isinstance(resolved(True), int)
    with pytest.raises(ConfigError, match="workload.cache_bust"):
        resolved(-1)
    with pytest.raises(ConfigError, match="workload.cache_bust"):
        resolved("yes")


def test_a_busted_prompt_keeps_its_length_and_bos() -> None:
    tokens = [91, 92, 93, 94]
    assert busted((1, 5, 6, 7, 8, 9), tokens, bos=1) == (1, 91, 92, 93, 94, 9)
    assert busted((5, 6, 7), tokens, bos=1) == (91, 92, 7)
    assert busted((5,), tokens, bos=None) == (5,)


@pytest.mark.integration
def test_a_nonce_makes_every_prompt_new_and_keeps_the_sharing_within_the_run(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    def prompts(*overrides: str) -> list[tuple[int, ...]]:
        cfg = preset("shared_prefix", "num_requests=8", *overrides)
        return [r.prompt_ids for r in build_workload(cfg, tokenizer, CONTEXT).requests]

    plain, first, again = prompts(), prompts("cache_bust=11"), prompts("cache_bust=11")
    other = prompts("cache_bust=12")
    assert first == again and first != other  # a nonce names its prompts
    assert all(len(a) == len(b) for a, b in zip(plain, first, strict=True))
    assert all(a[TOKENS:] == b[TOKENS:] for a, b in zip(plain, first, strict=True))
    heads = {p[:TOKENS] for p in first}
    assert len(heads) == 1 and heads != {p[:TOKENS] for p in other}  # one head per run
    assert not set(heads.pop()) & special_ids(tokenizer)
    shared = [0] + [max(n, TOKENS) for n in prefixes_in_run(plain)[1:]]
    assert prefixes_in_run(first) == shared  # shared within as before, and the new head
    assert all(prefixes_in_run([*plain, p])[-1] == 0 for p in first)  # none with a plain one
