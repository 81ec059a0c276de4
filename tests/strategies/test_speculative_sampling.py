"""Speculative sampling is lossless: served outputs are distributed exactly as the target's.

A tiny target with a 16-token vocabulary samples 4 tokens (temperature 0.9, top-k 6, top-p
0.95) after a fixed prompt, N = 2000 times with different seeds, through the engine with
gamma = 2: the first token comes from the prompt's forward, the next ones from
verifications that accept and reject drafts (two drafts in one verification, and one after
a rejection), the last often as a bonus token. The exact target distribution of the whole
output comes from the target's own next-token distributions (cache-free), and a chi-square
test over the outputs (cells expecting fewer than 5 pooled) must not reject it at level
0.001.

Power. The outputs the target can produce number 275 (draft model's prompt) and 545 (prompt
lookup's); pooled, the test has 66 and 80 degrees of freedom. At N = 2000 and level 0.001 it
detects with probability 0.9 any served distribution whose effect size w =
sqrt(Σ (served − target)² / target) over those cells is at least 0.19 (non-centrality
N w² of about 70); `test_power_statement` recomputes that bound.

The same test must reject a deliberately wrong rule that, after rejecting a draft, draws
from p instead of norm(max(0, p − q)) (so drafted tokens come out too often). Its exact
distribution is computed and the test's power against it asserted, so a change of model,
prompt or N that weakens the test fails it: with the draft model each drafted position
becomes min(p, q) + (1 − Σ min(p, q)) p, w = 0.35 (total variation 0.14 from the target,
non-centrality 244); prompt lookup's wrong distribution follows its deterministic drafts and
is computed by walking every path the engine can take, w = 0.38 (total variation 0.14,
non-centrality 286); power above 0.9999 against either. The test then serves the
wrong rule and requires the chi-square test to reject it.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch

from servelab.base.batch import ForwardBatch
from servelab.engine.request import Request, SamplingParams
from servelab.engine.sampler import probabilities
from servelab.models.model import LlamaModel
from servelab.strategies.decoding import acceptance
from servelab.strategies.decoding.ngram import lookup
from tests.tiny import dense_attention, make_engine, serve, strategy, tiny_model

VOCAB = 16
# prompts where the wrong rule shows: the draft model's q differs from p after the first; the
# second repeats tokens the target is likely to sample, so prompt lookup drafts often
PROMPTS = {"draft": (3, 1, 4, 1, 5), "ngram": (14, 7, 5, 1, 8, 7, 8, 2, 9, 10)}
OUTPUT = 4
GAMMA = 2
SAMPLES = 2000
LEVEL = 0.001
PARAMS = {"temperature": 0.9, "top_k": 6, "top_p": 0.95}

Distribution = dict[tuple[int, ...], float]


class Exact:
    """Next-token distributions of a model after any context, computed once each."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def __call__(self, context: tuple[int, ...]) -> np.ndarray:
        if context not in self.cache:
            batch = ForwardBatch.single(torch.tensor(context))
            layers = self.model.config.num_layers
            with torch.inference_mode():
                logits = self.model(batch, [None] * layers, [None] * layers, dense_attention)
            probs = probabilities(logits[0], SamplingParams(OUTPUT, **PARAMS)).double()
            self.cache[context] = (probs / probs.sum()).numpy()
        return self.cache[context]


def target_distribution(p: Exact, prompt: tuple[int, ...]) -> Distribution:
    """P(output) = the product of the target's conditionals, over every possible output."""
    found: Distribution = {(): 1.0}
    for _ in range(OUTPUT):
        found = {
            seq + (t,): prob * float(p(prompt + seq)[t])
            for seq, prob in found.items()
            for t in map(int, np.flatnonzero(p(prompt + seq)))
        }
    return found


def wrong_draft_distribution(p: Exact, q: Exact, prompt: tuple[int, ...]) -> Distribution:
    """The wrong rule with a draft model: every position after the first that can be drafted
    is min(p, q) + (1 − Σ min(p, q)) p; the last is always the target's own draw."""
    found: Distribution = {(): 1.0}
    for position in range(OUTPUT):
        grown: Distribution = {}
        for seq, prob in found.items():
            context = prompt + seq
            dist = p(context)
            if 0 < position < OUTPUT - 1:
                overlap = np.minimum(dist, q(context))
                dist = overlap + (1 - overlap.sum()) * dist
            for t in map(int, np.flatnonzero(dist)):
                grown[seq + (t,)] = prob * float(dist[t])
        found = grown
    return found


def wrong_lookup_distribution(p: Exact, prompt: tuple[int, ...]) -> Distribution:
    """The wrong rule with prompt lookup, by walking the engine's steps: each step drafts
    lookup(context, gamma) (gamma capped by what is left), emits accepted drafts and a draw."""
    found: Distribution = defaultdict(float)

    def step(seq: tuple[int, ...], prob: float) -> None:
        left = OUTPUT - len(seq)
        if left == 0:
            found[seq] += prob
            return
        context = prompt + seq
        gamma = min(GAMMA, left - 1) if seq else 0
        drafts = lookup(list(context), gamma, 1, 3) if gamma else []
        reach = prob
        for i, draft in enumerate(drafts):
            dist = p(context + tuple(drafts[:i]))
            for t in map(int, np.flatnonzero(dist)):  # rejected: the wrong rule draws from p itself
                step(seq + tuple(drafts[:i]) + (t,), reach * (1 - dist[draft]) * dist[t])
            reach *= dist[draft]
        dist = p(context + tuple(drafts))
        for t in np.flatnonzero(dist):
            step(seq + tuple(drafts) + (t,), reach * dist[t])

    step((), 1.0)
    return found


def chi_square(counts: Distribution, expected: Distribution) -> tuple[float, int, float]:
    """Statistic, degrees of freedom and p-value; cells expecting fewer than 5 are pooled,
    and any output the target can never produce lands in the pool."""
    cells = [(SAMPLES * prob, counts.get(seq, 0)) for seq, prob in expected.items()]
    big = [(e, o) for e, o in cells if e >= 5]
    pooled_o = SAMPLES - sum(o for _, o in big)
    pooled_e = SAMPLES - sum(e for e, _ in big)
    observed = np.array([o for _, o in big] + [pooled_o], dtype=np.float64)
    wanted = np.array([e for e, _ in big] + [pooled_e], dtype=np.float64)
    statistic = float(((observed - wanted) ** 2 / wanted).sum())
    df = len(wanted) - 1
    return statistic, df, _survival(statistic, df)


def _survival(statistic: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > statistic)."""
    half = torch.tensor(df / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(half, torch.tensor(statistic / 2, dtype=torch.float64)))


def noncentrality(expected: Distribution, wrong: Distribution) -> tuple[float, int]:
    """N w² of `wrong` against `expected` over the test's cells, and their degrees of freedom."""
    cells = [(SAMPLES * prob, SAMPLES * wrong.get(seq, 0.0)) for seq, prob in expected.items()]
    big = [(e, w) for e, w in cells if e >= 5]
    wanted = np.array([e for e, _ in big] + [SAMPLES - sum(e for e, _ in big)])
    shifted = np.array([w for _, w in big] + [SAMPLES - sum(w for _, w in big)])
    return float(((shifted - wanted) ** 2 / wanted).sum()), len(wanted) - 1


def critical(df: int) -> float:
    """The statistic above which the test rejects: survival(x) = LEVEL."""
    low, high = 0.0, 10.0 * (df + 10)
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if _survival(middle, df) > LEVEL else (low, middle)
    return high


def power(shift: float, df: int) -> float:
    """P(non-centrality `shift` chi-square with df degrees of freedom > the critical value)."""
    draws = np.random.default_rng(0).noncentral_chisquare(df, shift, 200_000)
    return float((draws > critical(df)).mean())


def smallest_detected(df: int, wanted_power: float = 0.9) -> float:
    """The effect size w = sqrt(non-centrality / N) the test detects with `wanted_power`."""
    low, high = 0.0, 10.0 * (df + 10)
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if power(middle, df) < wanted_power else (low, middle)
    return float(np.sqrt(high / SAMPLES))


def served_outputs(
    target: LlamaModel, proposer: str, draft: LlamaModel | None, prompt: tuple[int, ...]
) -> Distribution:
    requests = [
        Request(str(i), list(prompt), SamplingParams(OUTPUT, ignore_eos=True, seed=i, **PARAMS))
        for i in range(SAMPLES)
    ]
    settings = strategy(
        "iteration", "contiguous", decoding="speculative", proposer=proposer, gamma=GAMMA
    )
    engine = make_engine(
        target, settings, kv_slots=20_000, max_num_seqs=512, max_num_batched_tokens=8192,
        draft_model=draft,
    )  # fmt: skip
    serve(engine, requests)
    counts: Distribution = defaultdict(float)
    for request in requests:
        counts[tuple(request.output_ids)] += 1
    assert sum(r.counters.get("spec_proposed", 0) for r in requests) > SAMPLES / 2
    return counts


@pytest.fixture(scope="module")
def target() -> LlamaModel:
    return tiny_model(vocab_size=VOCAB)


@pytest.fixture(scope="module")
def draft() -> LlamaModel:
    return tiny_model(seed=3, vocab_size=VOCAB)


def _wrong_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    del q
    return p


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_speculative_sampling_matches_the_target_distribution(
    target: LlamaModel, draft: LlamaModel, proposer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = PROMPTS[proposer]
    p = Exact(target)
    expected = target_distribution(p, prompt)
    assert sum(expected.values()) == pytest.approx(1.0)
    if proposer == "draft":
        wrong = wrong_draft_distribution(p, Exact(draft), prompt)
    else:
        wrong = wrong_lookup_distribution(p, prompt)
    shift, df = noncentrality(expected, wrong)
    assert df == {"draft": 66, "ngram": 80}[proposer]  # the power statement's cells
    assert power(shift, df) > 0.999
    drafter = draft if proposer == "draft" else None

    statistic, df, p_value = chi_square(served_outputs(target, proposer, drafter, prompt), expected)
    assert p_value > LEVEL, (statistic, df)

    monkeypatch.setattr(acceptance, "residual", _wrong_residual)
    statistic, df, p_value = chi_square(served_outputs(target, proposer, drafter, prompt), expected)
    assert p_value < LEVEL, (statistic, df)


@pytest.mark.parametrize("df", [66, 80])
def test_power_statement(df: int) -> None:
    """The module docstring's bound: at N = 2000, level 0.001, power 0.9 from w = 0.19."""
    assert 0.17 < smallest_detected(df) <= 0.19
