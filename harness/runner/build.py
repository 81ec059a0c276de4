"""One way to make an engine: a model, typed engine settings and a strategy.

`load_for_strategy` loads the configured model as the strategy serves it: the head layout
converts the checkpoint, the weights format prepares (quantises) the result and supplies the
linear layers, and the head layout sets how each KV head is stored. `build_engine` sizes the
KV cache from the budget and wires the strategy's KV manager, scheduler, admission policy and
decoder around the model. Runs, `verify`, `perplexity`, the server and the tests' tiny
engines all go through these two functions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from harness.engine.engine import Engine
from harness.engine.kv_cache import KVLayout, allocate_kv_cache
from harness.engine.scheduling import SchedulerLimits
from harness.models.load import Checkpoint, LoadedModel, load_model, tokenizer_for
from harness.models.model import LlamaModel
from harness.models.weights_format import CalibrationText, WeightsContext, WeightsFormat
from harness.runner.settings import EngineSettings, cache_dir_of
from kernels.attention import Attention, AttentionConfig
from strategies.settings import StrategySettings
from workloads.text import text_section


@dataclass
class ServedModel:
    """A model loaded as a strategy serves it, with the weights format that made it."""

    loaded: LoadedModel
    weights: WeightsFormat
    checkpoint_id: str  # the dense checkpoint after the head layout's conversion

    @property
    def model(self) -> LlamaModel:
        return self.loaded.model

    @property
    def weights_id(self) -> str:
        """Names the served weights: checkpoint, head layout and weights format settings."""
        return f"{self.checkpoint_id}-{self.weights.settings_id()}"

    @property
    def weight_bytes(self) -> int:
        return self.weights.weight_bytes(self.loaded.model)


def load_for_strategy(
    cfg: DictConfig, settings: EngineSettings, strategy: StrategySettings, progress: bool = True
) -> ServedModel:
    """The configured model (`cfg.model`) with the strategy's head layout and weights."""
    heads = strategy.heads.build()
    weights = strategy.weights.build()
    cache_dir = cache_dir_of(cfg)
    served_id = ""  # the checkpoint's id with the head layout, set once it is read

    def transform(checkpoint: Checkpoint, checkpoint_id: str) -> Checkpoint:
        nonlocal served_id
        served_id = f"{checkpoint_id}-heads-{strategy.heads.value}"
        context = WeightsContext(
            dtype=settings.dtype,
            device=settings.device,
            cache_dir=cache_dir,
            checkpoint_id=served_id,
            progress=progress,
            calibration=calibration_text(cfg, cache_dir),
        )
        return weights.prepare(heads.convert(checkpoint), context)

    loaded = load_model(
        cfg.model, settings.dtype, settings.device, cache_dir, transform, weights.linear
    )
    heads.apply(loaded.model)
    return ServedModel(loaded, weights, served_id)


def calibration_text(cfg: DictConfig, cache_dir: Path) -> CalibrationText:
    """The calibration section of the built-in prose, tokenised by the model's tokenizer when a
    weights format asks (never used for prompts or perplexity)."""
    text = text_section("calibration")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return CalibrationText(
        name="pydoc_data.topics: calibration section",
        digest=digest,
        token_ids=lambda: tokenizer_for(cfg.model, cache_dir).encode(text),
    )


def kv_budget_bytes(settings: EngineSettings) -> int:
    """The configured KV budget in bytes (a fraction of free memory on a GPU)."""
    if settings.kv_budget_bytes is not None:
        return settings.kv_budget_bytes
    free, _ = torch.cuda.mem_get_info(settings.device)
    return int(free * settings.kv_budget_fraction)


def build_engine(
    model: LlamaModel,
    settings: EngineSettings,
    strategy: StrategySettings,
    clock: Callable[[], float],
) -> Engine:
    """An engine serving `model` under `strategy`, its KV cache sized by the budget."""
    config = model.config
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, settings.dtype)
    cache = allocate_kv_cache(
        layout, kv_budget_bytes(settings), strategy.kv_block_size, settings.device
    )
    kv = strategy.kv.build(cache)
    limits = SchedulerLimits(settings.max_batch_size, settings.max_num_batched_tokens)
    scheduler = strategy.batching.build(kv, limits, strategy.policy.build())
    return Engine(
        model=model,
        kv_cache=cache,
        scheduler=scheduler,
        decoder=strategy.decoding.build(),
        attention=Attention(AttentionConfig(impl=settings.attention), settings.device),
        device=settings.device,
        clock=clock,
        max_context=config.max_context,
        stop_token_ids=config.eos_token_ids,
    )
