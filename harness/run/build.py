"""One way to make an engine: a model, typed engine settings and a strategy.

`load_for_strategy` loads the configured model as the strategy serves it: the head layout
converts the checkpoint, the weights format prepares (quantises) the result and supplies the
linear layers, and the head layout sets how each KV head is stored (`load_served` does the
same for any model, such as a speculative draft model). `build_engine` sizes the KV
cache from the budget (shared with a drafting network's cache, if the decoding strategy has
one) and wires the strategy's KV manager, scheduler, admission policy and decoder around the
model. Runs, `verify`, `perplexity`, the server and the tests' tiny
engines all go through these two functions.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from servelab.engine.cuda_graphs import DecodeGraphs, GraphsRecord, buckets_for
from servelab.engine.engine import Engine
from servelab.engine.kv_cache import KVCache, KVLayout, allocate_kv_cache
from servelab.engine.model_runner import ModelRunner
from servelab.engine.scheduling import Scheduler, SchedulerLimits
from servelab.engine.step_update import StepUpdate
from servelab.harness.run.settings import EngineSettings
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.linear import pack_ahead
from servelab.models.fused_decode import fused_decode_layers
from servelab.models.gpu_layers import GpuLayers, gpu_layers
from servelab.models.load import (
    Checkpoint,
    LoadedModel,
    build_model,
    load_model,
    tokenizer_for,
)
from servelab.models.model import LlamaModel, ModelConfig
from servelab.models.spec import ModelSpec
from servelab.models.weights_format import CalibrationText, WeightsContext, WeightsFormat
from servelab.strategies.decoding.context import DecoderContext
from servelab.strategies.factories import HeadsChoice, WeightsChoice
from servelab.strategies.settings import StrategySettings
from servelab.workloads.text import text_section


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
    model: ModelSpec, settings: EngineSettings, strategy: StrategySettings, progress: bool = True
) -> ServedModel:
    """`model` with the strategy's head layout and weights."""
    return load_served(model, settings, strategy.heads, strategy.weights, progress)


def load_served(
    model: ModelSpec,
    settings: EngineSettings,
    heads_choice: HeadsChoice,
    weights_choice: WeightsChoice,
    progress: bool = True,
) -> ServedModel:
    """`model` with a head layout and a weights format."""
    heads = heads_choice.build()
    weights = weights_choice.build()
    served_id = ""  # the checkpoint's id with the head layout, set once it is read

    def transform(checkpoint: Checkpoint, checkpoint_id: str) -> Checkpoint:
        nonlocal served_id
        served_id = f"{checkpoint_id}-heads-{heads_choice.value}"
        context = WeightsContext(
            dtype=settings.dtype,
            device=settings.device,
            cache_dir=model.cache_dir,
            checkpoint_id=served_id,
            progress=progress,
            calibration=calibration_text(model),
        )
        return weights.prepare(heads.convert(checkpoint), context)

    loaded = load_model(model, settings.dtype, settings.device, transform, weights.linear)
    heads.apply(loaded.model)
    pack_ahead(loaded.model)  # start-up work, never inside the first request's latency
    return ServedModel(loaded, weights, served_id)


def random_model(
    shape: ModelConfig, weights_choice: WeightsChoice, dtype: torch.dtype, device: torch.device
) -> LlamaModel:
    """`shape` (any depth) with random weights, its linears the weights format's, as a run on
    a dummy shape builds them (for benchmarks and tests of one shape's layers)."""
    weights = weights_choice.build()
    # a dummy shape has no weights to prepare, so nothing is read from or kept in a cache
    context = WeightsContext(dtype, device, Path(tempfile.gettempdir()), "random", False)
    return build_model(weights.prepare((shape, None), context), dtype, device, weights.linear)


def calibration_text(model: ModelSpec) -> CalibrationText:
    """The calibration section of the built-in prose, tokenised by the model's tokenizer when a
    weights format asks (never used for prompts or perplexity)."""
    text = text_section("calibration")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return CalibrationText(
        name="pydoc_data.topics: calibration section",
        digest=digest,
        token_ids=lambda: tokenizer_for(model).encode(text),
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
    draft_model: LlamaModel | None = None,
) -> Engine:
    """An engine serving `model` under `strategy`, its KV cache sized by the budget; a
    speculative strategy that drafts with a network (the target's first layers, or
    `draft_model`) gets a second cache for it (see `kv_caches`)."""
    config = model.config
    source = strategy.draft_source
    drafter = source.network(model, draft_model) if source is not None else None
    cache, drafter_cache = kv_caches(model, drafter, settings, strategy.kv_block_size)
    scheduler = scheduler_over(cache, settings, strategy)
    attention = Attention(AttentionConfig(impl=settings.attention), settings.device)
    model.layer_runner = (
        fused_decode_layers(model, settings.dtype, settings.device, attention.impl)
        or gpu_layers(model, attention)
        if settings.fused_decode
        else None
    )
    context = DecoderContext(
        target=model,
        attention=attention,
        device=settings.device,
        build_kv=strategy.kv.build,
        draft_source=source,
        drafter=drafter,
        drafter_cache=drafter_cache,
    )
    update = StepUpdate(
        kv=scheduler.kv,
        scheduler=scheduler,
        decoder=strategy.decoding.build(context),
        clock=clock,
        max_context=config.max_context,
        stop_token_ids=config.eos_token_ids,
    )
    runner = ModelRunner(model, cache, attention, settings.device)
    runner.graphs, runner.graphs_record = decode_graphs(
        model, cache, attention, scheduler, settings
    )
    return Engine(runner, update)


def decode_graphs(
    model: LlamaModel,
    cache: KVCache,
    attention: Attention,
    scheduler: Scheduler,
    settings: EngineSettings,
) -> tuple[DecodeGraphs | None, GraphsRecord]:
    """The target's decode steps captured as CUDA graphs per batch-size bucket, where they
    apply (on CUDA, over the fused GPU layers), and what was done and why."""
    if not settings.cuda_graphs:
        return None, GraphsRecord(False, "engine.cuda_graphs=off")
    if settings.device.type != "cuda":
        return None, GraphsRecord(False, f"no CUDA ({settings.device.type})")
    if not isinstance(model.layer_runner, GpuLayers):
        return None, GraphsRecord(False, "the fused GPU layers do not apply to this model")
    paged = "block_tables" in scheduler.kv.layout([])
    capacity = min(model.config.max_context, cache.num_slots)
    graphs = DecodeGraphs(model, cache, attention, paged, capacity, settings.device)
    record = graphs.capture(buckets_for(settings.max_batch_size))
    return (graphs if record.enabled else None), record


def scheduler_over(
    cache: KVCache, settings: EngineSettings, strategy: StrategySettings
) -> Scheduler:
    """The strategy's scheduler and admission policy, within the engine's step limits, over
    the strategy's KV manager of `cache` (`scheduler.kv`)."""
    kv = strategy.kv.build(cache)
    limits = SchedulerLimits(settings.max_batch_size, settings.max_num_batched_tokens)
    return strategy.batching.build(kv, limits, strategy.policy.build())


def kv_caches(
    model: LlamaModel, drafter: LlamaModel | None, settings: EngineSettings, block_size: int
) -> tuple[KVCache, KVCache | None]:
    """The target's KV cache and the drafter's, if any. The budget holds both: it is split so
    that each holds the same number of tokens (whole blocks), in proportion to what a token
    costs each, so a speculative run spends no more KV memory than a plain one."""
    budget = kv_budget_bytes(settings)
    layout = kv_layout(model, settings.dtype)
    if drafter is None:
        return allocate_kv_cache(layout, budget, block_size, settings.device), None
    drafter_layout = kv_layout(drafter, settings.dtype)
    tokens = budget // (layout.bytes_per_token + drafter_layout.bytes_per_token)
    cache = allocate_kv_cache(layout, tokens * layout.bytes_per_token, block_size, settings.device)
    drafter_bytes = cache.num_slots * drafter_layout.bytes_per_token
    return cache, allocate_kv_cache(drafter_layout, drafter_bytes, block_size, settings.device)


def kv_layout(model: LlamaModel, dtype: torch.dtype) -> KVLayout:
    config = model.config
    return KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, dtype)
