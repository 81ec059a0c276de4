"""`servelab perplexity`: the configured model, as a strategy serves it, on held-out text.

The head layout and weights format of `strategy` apply, so a conversion's quality cost
(fewer KV heads, int4 weights) is measured on the same evaluation text for every option. The
figure is kept in the served weights' quality record (`harness.measure.weights_quality`),
by dtype, where runs and reports find it.
"""

from __future__ import annotations

from omegaconf import DictConfig

from harness.commands.config import compose, take_counts
from harness.errors import ConfigError
from harness.measure.perplexity import perplexity
from harness.measure.weights_quality import perplexity_entry, record_quality
from harness.runner.build import load_for_strategy
from harness.runner.settings import DTYPES, cache_dir_of, engine_settings
from kernels.attention import Attention, AttentionConfig
from strategies.settings import strategy_settings
from workloads.text import text_section

DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
SUMMARY = "perplexity on held-out text of the model as a strategy serves it (heads, weights)"
USAGE = """usage: servelab perplexity [windows=N] [strategy.heads=...] [strategy.weights=...]

Scores N windows of 512 tokens of the evaluation text (never used for prompts or
calibration) and prints the perplexity."""


def main(args: list[str]) -> None:
    numbers, rest = take_counts(args, {"windows": 16})
    print(perplexity_main(compose(rest), numbers["windows"]))


def perplexity_main(cfg: DictConfig, windows: int) -> str:
    settings = engine_settings(cfg.engine)
    strategy = strategy_settings(cfg.strategy)
    served = load_for_strategy(cfg, settings, strategy)
    loaded = served.loaded
    if loaded.tokenizer is None:
        raise ConfigError("model", "perplexity needs a model with a tokenizer, not dummy weights")
    ids = loaded.tokenizer.encode(text_section("evaluation"))
    attention = Attention(AttentionConfig(impl=settings.attention), settings.device)
    value, scored = perplexity(loaded.model, ids, attention, max_windows=windows)
    dtype = DTYPE_NAMES[settings.dtype]
    entry = {dtype: perplexity_entry(value, scored, windows)}
    record_quality(cache_dir_of(cfg), served.weights_id, {"perplexity": entry})
    stored = loaded.model.kv_heads_stored
    return (
        f"{cfg.model.name} heads={strategy.heads.value} ({stored} KV heads stored) "
        f"weights={strategy.weights.value} dtype={str(settings.dtype).removeprefix('torch.')}: "
        f"perplexity {value:.3f} over {scored} tokens of held-out text"
    )
