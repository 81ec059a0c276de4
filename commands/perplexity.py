"""`servelab perplexity`: the configured model, as a strategy serves it, on held-out text.

The head layout and weights format of `strategy` apply, so a conversion's quality cost
(fewer KV heads, int4 weights) is measured on the same evaluation text for every option.
"""

from __future__ import annotations

from servelab.commands.config import take_counts
from servelab.harness.run.compose import compose
from servelab.harness.run.perplexity import served_perplexity
from servelab.harness.run.spec import engine_spec

SUMMARY = "perplexity on held-out text of the model as a strategy serves it (heads, weights)"
USAGE = """usage: servelab perplexity [windows=N] [strategy.heads=...] [strategy.weights=...]

Scores N windows of 512 tokens of the evaluation text (never used for prompts or
calibration) and prints the perplexity."""


def main(args: list[str]) -> None:
    numbers, rest = take_counts(args, {"windows": 16})
    print(served_perplexity(engine_spec(compose(rest)), numbers["windows"]).describe())
