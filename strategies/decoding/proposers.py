"""The proposer axis (`strategy.proposer`): what drafts for speculative decoding, as a registry.

Each option reads its own keys and builds a `DraftSource`: what it drafts with (no network,
the target's first layers, or a separately loaded draft model), the check it makes against
the target before anything loads, and how it makes its `Proposer` once the engine's caches
exist. Nothing downstream compares proposer names: the runner asks the source whether it
needs a draft model loaded, the engine builder asks it for its drafting network.

- `ngram`: prompt lookup (`strategies.decoding.ngram`), no network;
- `layerskip`: the target's first `layerskip_layers` layers (`strategies.decoding.layerskip`);
- `draft`: a separate model (`draft_model`, a preset or `target`, in `draft_weights`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servelab.base.errors import ConfigError
from servelab.engine.model_runner import ModelRunner
from servelab.models.model import LlamaModel, ModelConfig
from servelab.strategies.decoding.context import DecoderContext
from servelab.strategies.decoding.layerskip import early_exit
from servelab.strategies.decoding.model_drafter import ModelDrafter
from servelab.strategies.decoding.ngram import NgramProposer
from servelab.strategies.decoding.proposer import Proposer
from servelab.strategies.registry import Option, Registry

if TYPE_CHECKING:
    from servelab.strategies.factories import ProposerOption
from servelab.strategies.weights import WEIGHTS

TARGET = "target"  # `draft_model`: the served model's own checkpoint


class DraftSource(ABC):
    """A chosen proposer with its keys."""

    def check(self, target: ModelConfig) -> None:
        """Raise a `ConfigError` when it cannot draft for `target` (before anything loads)."""
        del target

    def network(self, target: LlamaModel, draft_model: LlamaModel | None) -> LlamaModel | None:
        """The network it drafts with, whose KV cache is sized beside the target's (None:
        it drafts without one)."""
        del target, draft_model
        return None

    @abstractmethod
    def build(self, context: DecoderContext) -> Proposer: ...


def _network_drafter(context: DecoderContext) -> ModelDrafter:
    """A drafter over the drafting network and its own KV cache, managed like the target's."""
    if context.drafter is None or context.drafter_cache is None:
        raise RuntimeError("the proposer drafts with a network, but build_engine gave none")
    runner = ModelRunner(context.drafter, context.drafter_cache, context.attention, context.device)
    return ModelDrafter(runner, context.build_kv(context.drafter_cache))


@dataclass(frozen=True)
class NgramConfig:
    ngram_min: int = field(default=1, metadata={"minimum": 1, "help": "ngram: shortest match"})
    ngram_max: int = field(default=3, metadata={"minimum": 1, "help": "ngram: longest match"})

    def check(self) -> None:
        if self.ngram_min > self.ngram_max:
            raise ConfigError(
                "strategy.ngram_min",
                f"{self.ngram_min} is above strategy.ngram_max={self.ngram_max}; lower it",
            )


class NgramSource(DraftSource):
    def __init__(self, config: NgramConfig) -> None:
        self.config = config

    def build(self, context: DecoderContext) -> Proposer:
        del context
        return NgramProposer(self.config.ngram_min, self.config.ngram_max)


@dataclass(frozen=True)
class LayerSkipConfig:
    layerskip_layers: int = field(
        default=8, metadata={"minimum": 1, "help": "layerskip: target layers the draft runs"}
    )


class LayerSkipSource(DraftSource):
    def __init__(self, config: LayerSkipConfig) -> None:
        self.config = config

    def check(self, target: ModelConfig) -> None:
        if self.config.layerskip_layers >= target.num_layers:
            raise ConfigError(
                "strategy.layerskip_layers",
                f"{self.config.layerskip_layers} is not fewer than the target's "
                f"{target.num_layers} layers; draft with fewer",
            )

    def network(self, target: LlamaModel, draft_model: LlamaModel | None) -> LlamaModel:
        del draft_model
        return early_exit(target, self.config.layerskip_layers)

    def build(self, context: DecoderContext) -> Proposer:
        return _network_drafter(context)


@dataclass(frozen=True)
class DraftConfig:
    draft_model: str = field(
        default=TARGET, metadata={"help": "draft: a model preset (conf/model), or target"}
    )
    draft_weights: str = field(
        default="dense",
        metadata={"choices": WEIGHTS.names, "help": "draft: the draft model's weights format"},
    )


class DraftModelSource(DraftSource):
    """A separate draft model: the runner loads it (`harness.run.draft`) and checks its
    vocabulary against the target's before anything loads."""

    def __init__(self, config: DraftConfig) -> None:
        self.config = config

    def network(self, target: LlamaModel, draft_model: LlamaModel | None) -> LlamaModel:
        del target
        if draft_model is None:
            raise ConfigError(
                "strategy.draft_model", "proposer=draft but no draft model was loaded; name one"
            )
        return draft_model

    def build(self, context: DecoderContext) -> Proposer:
        return _network_drafter(context)


NGRAM: ProposerOption = Option(
    "ngram", "prompt lookup: copy what followed the last n tokens", NgramConfig, NgramSource
)
LAYERSKIP: ProposerOption = Option(
    "layerskip", "the target's first layers, then its norm and head", LayerSkipConfig,
    LayerSkipSource,
)  # fmt: skip
DRAFT: ProposerOption = Option(
    "draft", "a separate draft model with the target's vocabulary", DraftConfig,
    DraftModelSource,
)  # fmt: skip
PROPOSERS = Registry("proposer", [NGRAM, LAYERSKIP, DRAFT])
