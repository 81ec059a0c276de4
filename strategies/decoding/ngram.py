"""Prompt lookup (`strategy.proposer=ngram`): draft by copying what followed the last n tokens
the last time they occurred in the request's own prompt and output. No model runs.

For n from `ngram_max` down to `ngram_min` (longest first), the request's last n tokens are
searched for in its earlier tokens; the most recent earlier occurrence that has a
continuation wins, and up to gamma tokens of that continuation are proposed. Answers that
quote, summarise or continue their input repeat its n-grams, which is where this pays.
Its drafts are certain (q is one-hot).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from servelab.strategies.decoding.proposer import Proposal, Proposer, Want


def lookup(tokens: list[int], gamma: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to `gamma` tokens that followed the most recent earlier occurrence of the longest
    suffix of `tokens` (of `ngram_max` down to `ngram_min` tokens) found again."""
    length = len(tokens)
    array: np.ndarray = np.asarray(tokens, dtype=np.int64)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        windows = sliding_window_view(array[: length - 1], n)  # every n-gram with a successor
        hits = np.flatnonzero((windows == array[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + gamma]
    return []


class NgramProposer(Proposer):
    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max

    def propose(self, wants: list[Want]) -> list[Proposal]:
        return [
            Proposal(lookup(w.request.all_token_ids(), w.gamma, self.ngram_min, self.ngram_max))
            for w in wants
        ]
