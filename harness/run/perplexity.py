"""Perplexity of the configured model as a strategy serves it, on the held-out evaluation text.

The strategy's head layout and weights format apply (through `load_for_strategy`, as in a
run), so a conversion's quality cost is measured on the same text for every option. Dummy
weights borrow the embedded model's tokenizer, as their runs do. `servelab perplexity` and
the gates' perplexity claims both measure through here, and every figure is kept in the
served weights' quality record (`harness.measure.weights_quality`), by dtype, where runs and
reports find it.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.harness.measure.perplexity import perplexity
from servelab.harness.measure.weights_quality import perplexity_entry, record_quality
from servelab.harness.run.build import load_for_strategy
from servelab.harness.run.settings import dtype_name
from servelab.harness.run.spec import EngineSpec
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.models.load import tokenizer_for
from servelab.workloads.text import text_section


@dataclass(frozen=True)
class ServedPerplexity:
    model: str
    heads: str
    weights: str
    stored_kv_heads: int
    dtype: str
    perplexity: float
    tokens: int  # tokens scored

    def describe(self) -> str:
        return (
            f"{self.model} heads={self.heads} ({self.stored_kv_heads} KV heads stored) "
            f"weights={self.weights} dtype={self.dtype}: perplexity {self.perplexity:.3f} "
            f"over {self.tokens} tokens of held-out text"
        )


def served_perplexity(spec: EngineSpec, windows: int, progress: bool = True) -> ServedPerplexity:
    """Score `windows` windows of 512 tokens of the evaluation text served as `spec` says."""
    settings, strategy, model = spec.settings, spec.strategy, spec.model
    served = load_for_strategy(model, settings, strategy, progress)
    loaded = served.loaded
    tokenizer = loaded.tokenizer or tokenizer_for(model)
    ids = tokenizer.encode(text_section("evaluation"))
    attention = Attention(AttentionConfig(impl=settings.attention), settings.device)
    value, scored = perplexity(loaded.model, ids, attention, max_windows=windows)
    dtype = dtype_name(settings.dtype)
    entry = {dtype: perplexity_entry(value, scored, windows)}
    record_quality(spec.cache_dir, served.weights_id, {"perplexity": entry})
    return ServedPerplexity(
        model=model.name,
        heads=strategy.heads.value,
        weights=strategy.weights.value,
        stored_kv_heads=loaded.model.kv_heads_stored,
        dtype=str(settings.dtype).removeprefix("torch."),
        perplexity=value,
        tokens=scored,
    )
