"""The simulated engine: servelab's engine under `strategy`, its forward replaced by a
prediction of each step's time on a virtual clock, from a step-cost model fitted on real runs
(`cost_model`, a file `servelab fit-steps` writes) or one derived from a hardware preset's
published specifications (`hardware`, dense weights); and what a cost model must have been
fitted on to stand for a run (`described_by`). `backend=simulated`
(`harness.run.backends.simulated`) replays a workload on it; `search` predicts with it.

The strategy's scheduler, admission policy and KV manager run for real on the model's shape
(its KV cache on PyTorch's meta device: no weights are loaded and no KV memory is allocated,
so a 13B shape simulates on a laptop; a model is built, on the meta device, only to count the
parameters a hardware preset moves); only each step's duration is predicted."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from servelab.engine.engine import Engine
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.step_update import StepUpdate
from servelab.harness.measure.roofline import ModelShape
from servelab.harness.run.build import kv_budget_bytes, scheduler_over
from servelab.harness.run.settings import EngineSettings, dtype_name
from servelab.harness.run.simulate.cost_model import StepCostModel
from servelab.harness.run.simulate.hardware import Hardware, RooflineStepTime
from servelab.harness.run.simulate.runner import SimulatedRunner, StepTime, VirtualClock
from servelab.models.load import model_config_of
from servelab.models.model import LlamaModel, ModelConfig
from servelab.models.spec import ModelSpec
from servelab.strategies.decoding.standard import StandardDecoder
from servelab.strategies.settings import StrategySettings

META_DEVICE = torch.device("meta")


def described_by(settings: EngineSettings, strategy: StrategySettings, model: str) -> dict:
    """What a cost model must have been fitted on to describe a run of these settings."""
    return {
        "model": model,
        "dtype": dtype_name(settings.dtype),
        "weights": strategy.weights.value,
        "heads": strategy.heads.value,
        "device": settings.device.type,
    }


def simulated_serves(settings: EngineSettings, strategy: StrategySettings, model: str) -> dict:
    """What a cost model must have been fitted on to simulate a run of these settings: all of
    `described_by` but the device, which is the one the model's steps were timed on (the
    simulation predicts it; the machine running the simulation need not have it)."""
    served = described_by(settings, strategy, model)
    del served["device"]
    return served


def simulated_engine(
    config: ModelConfig,
    settings: EngineSettings,
    strategy: StrategySettings,
    timing: StepTime,
    clock: VirtualClock,
) -> Engine:
    """The strategy's engine for a model of `config`'s shape, its forward predicted by
    `timing` on `clock`. Its KV cache is laid out as the head layout stores it, on the meta
    device; no model is built, since nothing runs one (building it on the meta device took a
    second: its first operations there import much of torch's Python). Speculative decoding
    is refused before this: every step decodes as `standard` does."""
    heads = strategy.heads.build().stored_kv_heads(config)
    layout = KVLayout(config.num_layers, heads, config.head_dim, settings.dtype)
    budget = kv_budget_bytes(settings)
    cache = allocate_kv_cache(layout, budget, strategy.kv_block_size, META_DEVICE)
    scheduler = scheduler_over(cache, settings, strategy)
    update = StepUpdate(
        kv=scheduler.kv,
        scheduler=scheduler,
        decoder=StandardDecoder(),
        clock=clock,
        max_context=config.max_context,
        stop_token_ids=config.eos_token_ids,
    )
    return Engine(SimulatedRunner(timing, clock), update)


def meta_model(model_spec: ModelSpec, strategy: StrategySettings) -> LlamaModel:
    """The model's shape, after the strategy's head layout, on the meta device."""
    config = model_config_of(model_spec)
    layout = strategy.heads.build()
    target = min(layout.stored_kv_heads(config), config.num_kv_heads)
    with META_DEVICE:
        model = LlamaModel(replace(config, num_kv_heads=target))
    layout.apply(model)
    return model


def fitted_record(path: Path, fitted: StepCostModel) -> dict[str, Any]:
    return {
        "cost_model": str(path),
        "fitted_on": fitted.described,
        "measured_on": fitted.measured_on,
        "sources": fitted.sources,
        "fit_median_error": fitted.quality.median_error if fitted.quality else None,
    }


def derived_timing(hardware: Hardware, model: LlamaModel, dtype: torch.dtype) -> RooflineStepTime:
    """Step times on `hardware` for dense weights of `model`'s shape in `dtype`."""
    element = torch.empty((), dtype=dtype).element_size()
    untied = not model.config.tie_embeddings
    parameters = sum(
        p.numel()
        for name, p in model.named_parameters()
        if not (untied and name == "embed_tokens.weight")
    )
    return RooflineStepTime(
        hardware, ModelShape.of(model.config), parameters * element, element,
        model.kv_heads_stored,
    )  # fmt: skip
