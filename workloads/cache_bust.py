"""A run's prompts made new to a server's prefix cache, their sharing kept
(`workload.cache_bust`).

A server with prefix caching keeps the KV of the prompts it served, so a repeat of the same
seeded workload finds them cached and measures warm prefills (`harness/measure/prompt_cache.py`
detects it). With a nonce, the first `TOKENS` tokens of every prompt (after a leading BOS) are
replaced by tokens drawn from it, the same for every prompt of the run: a prefix cache keys a
block by every token before it, so no block an earlier run cached matches, while prompts that
shared a prefix within the run still share it, and every prompt keeps its length. `true` draws
a new nonce for each run (`resolved`, called where a run is specified), written into the run's
config, so the run can be repeated exactly with that number.
"""

from __future__ import annotations

import random
import secrets

from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.corpus import ordinary_ids

TOKENS = 4  # replaced at the head of every prompt
FIELD = "workload.cache_bust"


def resolved(value: object) -> int | None:
    """The nonce `value` names: None for null or false, a fresh one for true."""
    if value is None or value is False:
        return None
    if value is True:
        return secrets.randbelow(2**31)
    if not isinstance(value, int) or value < 0:
        raise ConfigError(FIELD, f"{value!r}: give true, false or a nonce (an integer >= 0)")
    return value


def bust_tokens(nonce: int, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """`TOKENS` ordinary token ids (no special one) drawn from `nonce`."""
    ordinary = ordinary_ids(tokenizer)
    draw = random.Random(nonce)
    return [int(ordinary[draw.randrange(len(ordinary))]) for _ in range(TOKENS)]


def busted(ids: tuple[int, ...], tokens: list[int], bos: int | None) -> tuple[int, ...]:
    """`ids` with its head (after a leading `bos`) replaced by `tokens`, its length kept (a
    prompt too short for all of them keeps its last token)."""
    start = 1 if ids and ids[0] == bos else 0
    room = max(min(len(tokens), len(ids) - start - 1), 0)
    return (*ids[:start], *tokens[:room], *ids[start + room :])
