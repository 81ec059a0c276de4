"""Build a workload from its config: checked config, rows, limits, order, windows, hash.

`build_workload` is a pure function of the config (with its seed), the tokenizer and the
model's context length: the same inputs give the same requests and the same hash.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.cache_bust import bust_tokens, busted
from servelab.workloads.config import ROOT, WorkloadConfig, parse_workload_config
from servelab.workloads.corpus import Prompt
from servelab.workloads.hashing import workload_hash
from servelab.workloads.seeds import Stream, stream
from servelab.workloads.sources import Draft, draft_requests
from servelab.workloads.spec import RequestSpec, Workload
from servelab.workloads.windows import mark_excluded

_SEED_LIMIT = 2**31 - 1


def build_workload(cfg: object, tokenizer: PreTrainedTokenizerBase, max_context: int) -> Workload:
    """The requests that `cfg` (the `workload` node, or it parsed) describes, arrival-ordered
    and hashed."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise ConfigError("max_context", f"is {max_context!r}; give the model's context length")
    config = cfg if isinstance(cfg, WorkloadConfig) else parse_workload_config(cfg)
    draft = draft_requests(config, tokenizer, max_context)
    seeds = stream(config.seed, Stream.SAMPLING).integers(0, _SEED_LIMIT, size=len(draft.ids))
    order = np.argsort(draft.arrivals, kind="stable")
    arrivals = [float(draft.arrivals[i]) for i in order]
    excluded = mark_excluded(arrivals, config.warmup, config.cooldown)
    if all(excluded):
        raise ConfigError(
            f"{ROOT}.warmup",
            f"warm-up and cool-down cover all {len(excluded)} requests; shrink them",
        )
    if config.cache_bust is not None:  # every prompt's head drawn from the nonce
        tokens = bust_tokens(config.cache_bust, tokenizer)
        heads = [busted(p.ids, tokens, tokenizer.bos_token_id) for p in draft.prompts]
        prompts = [Prompt(ids, tokenizer.decode(list(ids))) for ids in heads]
        draft = replace(draft, prompts=prompts)
    requests = tuple(
        _request(config, draft, int(index), arrival, exclude, int(seeds[index]))
        for index, arrival, exclude in zip(order, arrivals, excluded, strict=True)
    )
    concurrency = config.arrival.concurrency
    think = config.arrival.think_s
    return Workload(
        name=config.name,
        requests=requests,
        hash=workload_hash(requests, concurrency, think),
        concurrency=concurrency,
        think_s=think,
    )


def _request(
    config: WorkloadConfig, draft: Draft, index: int, arrival: float, excluded: bool, seed: int
) -> RequestSpec:
    prompt = draft.prompts[index]
    return RequestSpec(
        id=draft.ids[index],
        prompt_ids=prompt.ids,
        max_tokens=draft.max_tokens[index],
        arrival=arrival,
        excluded=excluded,
        prompt_text=prompt.text,
        ignore_eos=config.ignore_eos,
        temperature=config.sampling.temperature,
        top_k=config.sampling.top_k,
        top_p=config.sampling.top_p,
        seed=seed,
        n=config.sampling.n,
    )
