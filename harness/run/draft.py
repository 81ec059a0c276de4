"""The draft model of `strategy.proposer=draft`: which one, checked before any work, loaded.

`strategy.draft_model` names a model preset (a file of `conf/model/`, e.g. `dummy-tiny`) or
`target`, the served model's own checkpoint; `strategy.draft_weights` names the weights format
it is served in (any `strategy.weights` option, so the int4 model can draft for the dense one).
The draft keeps its checkpoint's native KV heads. The target itself in the same weights is not
loaded twice: the served model drafts for itself (every greedy draft is then accepted, a check
of the drafting machinery rather than a speedup).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.run.build import ServedModel, load_served
from servelab.harness.run.settings import CONF_DIR, EngineSettings
from servelab.models.load import model_config_of
from servelab.models.model import LlamaModel
from servelab.models.spec import ModelSpec, model_spec
from servelab.strategies.decoding.proposers import TARGET, DraftModelSource
from servelab.strategies.heads import HEADS
from servelab.strategies.settings import StrategySettings


def draft_model_of(target: ModelSpec, strategy: StrategySettings) -> ModelSpec | None:
    """The draft model the strategy names, checked against the target before anything loads
    (None unless it drafts with a second model); one line for a drafter that cannot work."""
    source = strategy.draft_source
    if source is None:
        return None
    target_config = model_config_of(target)
    source.check(target_config)
    if not isinstance(source, DraftModelSource):
        return None
    name = source.config.draft_model
    draft = target if name == TARGET else preset_model(name, target.cache_dir)
    vocab = model_config_of(draft).vocab_size
    if vocab != target_config.vocab_size:
        raise ConfigError(
            "strategy.draft_model",
            f"{name} has a vocabulary of {vocab}, the target "
            f"{target_config.vocab_size}; the draft must share the target's tokenizer",
        )
    return draft


def preset_model(name: str, cache_dir: Path) -> ModelSpec:
    """The model preset `conf/model/NAME.yaml`."""
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ConfigError(
            "strategy.draft_model", f"unknown model preset {name!r}; choose {TARGET} or: {known}"
        )
    node = OmegaConf.load(path)
    assert isinstance(node, DictConfig)
    return model_spec(node, cache_dir)


def load_draft(
    draft: ModelSpec | None,
    settings: EngineSettings,
    strategy: StrategySettings,
    served: ServedModel,
    progress: bool = True,
) -> LlamaModel | None:
    """The draft model (None unless the strategy drafts with a second model); the served
    model itself where the draft is the target in the same weights."""
    source, weights = strategy.draft_source, strategy.draft_weights
    if draft is None or weights is None or not isinstance(source, DraftModelSource):
        return None
    if source.config.draft_model == TARGET and weights.value == strategy.weights.value:
        return served.model
    heads = HEADS.choose({"heads": "gqa"})
    return load_served(draft, settings, heads, weights, progress).model
