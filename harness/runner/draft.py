"""The draft model of `strategy.proposer=draft`: which one, checked before any work, loaded.

`strategy.draft_model` names a model preset (a file of `conf/model/`, e.g. `dummy-tiny`) or
`target`, the served model's own checkpoint; `strategy.draft_weights` names the weights format
it is served in (any `strategy.weights` option, so the int4 model can draft for the dense one).
The draft keeps its checkpoint's native KV heads. The target itself in the same weights is not
loaded twice: the served model drafts for itself (every greedy draft is then accepted, a check
of the drafting machinery rather than a speedup).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.models.load import model_config_of
from servelab.harness.models.model import LlamaModel
from servelab.harness.runner.build import ServedModel, load_served
from servelab.harness.runner.settings import CONF_DIR, EngineSettings, cache_dir_of
from servelab.strategies.decoding.proposers import TARGET, DraftModelSource
from servelab.strategies.heads import HEADS
from servelab.strategies.settings import StrategySettings
from servelab.strategies.weights import WEIGHTS


def check_drafting(cfg: DictConfig, strategy: StrategySettings) -> None:
    """One line, before anything loads, for a drafter that cannot work with this target."""
    source = strategy.draft_source
    if source is None:
        return
    cache_dir = cache_dir_of(cfg)
    target = model_config_of(cfg.model, cache_dir)
    source.check(target)
    if isinstance(source, DraftModelSource):
        name = source.config.draft_model
        draft = model_config_of(draft_model_node(cfg, name), cache_dir)
        if draft.vocab_size != target.vocab_size:
            raise ConfigError(
                "strategy.draft_model",
                f"{name} has a vocabulary of {draft.vocab_size}, the target "
                f"{target.vocab_size}; the draft must share the target's tokenizer",
            )


def draft_model_node(cfg: DictConfig, name: str) -> DictConfig:
    """The model config the draft loads: the target's, or the preset `conf/model/NAME.yaml`."""
    if name == TARGET:
        return cfg.model
    path = CONF_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ConfigError(
            "strategy.draft_model", f"unknown model preset {name!r}; choose {TARGET} or: {known}"
        )
    node = OmegaConf.load(path)
    assert isinstance(node, DictConfig)
    return node


def load_draft(
    cfg: DictConfig,
    settings: EngineSettings,
    strategy: StrategySettings,
    served: ServedModel,
    progress: bool = True,
) -> LlamaModel | None:
    """The draft model the strategy names (None unless it drafts with a second model)."""
    source = strategy.draft_source
    if not isinstance(source, DraftModelSource):
        return None
    config = source.config
    if config.draft_model == TARGET and config.draft_weights == strategy.weights.value:
        return served.model
    node = OmegaConf.to_container(cfg.strategy, resolve=True)
    assert isinstance(node, dict)
    weights = WEIGHTS.choose({**node, "weights": config.draft_weights})
    heads = HEADS.choose({"heads": "gqa"})
    model_node = draft_model_node(cfg, config.draft_model)
    return load_served(model_node, cache_dir_of(cfg), settings, heads, weights, progress).model
