"""`backend=simulated`: servelab's engine under `strategy`, its forward replaced by a
prediction of each step's time, in virtual time: a step-cost model fitted on real runs
(`simulate.cost_model`, a file `servelab fit-steps` writes), or one derived from a hardware
preset's published specifications (`simulate.hardware`, dense weights).

The strategy's scheduler, admission policy and KV manager run for real on the model's shape
(its KV cache on PyTorch's meta device: no weights are loaded and no KV memory is allocated,
so a 13B shape simulates on a laptop; a model is built, on the meta device, only to count the
parameters a hardware preset moves); only each step's duration is predicted. The run
directory, summary and report are a real run's, marked as simulated in `meta.json`, the
summary's `simulated` entry and its flags. Speculative decoding is refused: its accepted
lengths come from the model's tokens, which a simulation does not compute.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from servelab.base.errors import ConfigError
from servelab.engine.engine import Engine
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.engine.step_update import StepUpdate
from servelab.harness.measure.flags import SIMULATED, Flag
from servelab.harness.measure.roofline import ModelShape
from servelab.harness.measure.rundir import RunRecords, RunWriter
from servelab.harness.measure.slo.early_stop import stop_rule
from servelab.harness.runner.backends.base import Backend, peer_inputs
from servelab.harness.runner.build import kv_budget_bytes, scheduler_over
from servelab.harness.runner.clock import RunClock
from servelab.harness.runner.replay import requests_of
from servelab.harness.runner.settings import EngineSettings, dtype_name
from servelab.harness.simulate.cost_model import StepCostModel
from servelab.harness.simulate.hardware import Hardware, RooflineStepTime, hardware_preset
from servelab.harness.simulate.replay import simulate
from servelab.harness.simulate.runner import SimulatedRunner, StepTime, VirtualClock
from servelab.models.load import model_config_of
from servelab.models.model import LlamaModel, ModelConfig
from servelab.models.spec import ModelSpec
from servelab.strategies.decoding.speculative import SpeculativeConfig
from servelab.strategies.decoding.standard import StandardDecoder
from servelab.strategies.settings import StrategySettings

if TYPE_CHECKING:
    from servelab.harness.runner.spec import RunSpec

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


class SimulatedBackend(Backend):
    no_telemetry = (
        "simulated: its clock is virtual, and the machine running it is not the one it predicts"
    )

    def __init__(self, spec: RunSpec) -> None:
        engine, simulation = spec.engine_or_fail(), spec.simulate
        assert simulation is not None  # run_spec reads it for backend=simulated
        settings, strategy = engine.settings, engine.strategy
        if isinstance(strategy.decoding.config, SpeculativeConfig):
            raise ConfigError(
                "backend", "a simulation cannot speculate: accepted drafts need real tokens"
            )
        path, preset = simulation.cost_model, simulation.hardware
        hardware = None if preset is None else hardware_preset(preset)  # a name it knows
        inputs = peer_inputs(spec.model, spec.workload)
        if not all(spec.ignore_eos for spec in inputs.workload.requests):
            raise ConfigError(
                "workload.ignore_eos",
                "a simulation's output lengths are the workload's: set workload.ignore_eos=true",
            )
        self.slo, self.skip_idle = spec.slo, spec.skip_idle
        self.workload = inputs.workload
        self.device = torch.device("cpu")  # where the simulation runs
        self.model_file, self.model_sha256 = inputs.model_file, inputs.model_sha256
        self.seeds = spec.seeds
        self.strategy = strategy
        self.clock = VirtualClock()
        self.timing: StepTime
        if path is not None:
            fitted = StepCostModel.load(path)
            fitted.check_describes(simulated_serves(settings, strategy, spec.model.name))
            self.timing, self.basis = fitted, fitted_record(path, fitted)
            self.said = f"predicted by {path.name}, fitted on steps timed on " + (
                fitted.measured_on or f"a {fitted.described.get('device', 'device')}"
            )
        else:
            if strategy.weights.value != "dense":
                raise ConfigError(
                    "simulate.hardware", "a hardware preset describes dense weights only"
                )
            model = meta_model(spec.model, strategy)
            assert hardware is not None  # simulate_settings: one of the two is given
            derived = derived_timing(hardware, model, settings.dtype)
            self.timing, self.basis = derived, {"derived_from": derived.record()}
            self.said = (
                f"derived from the published specifications of {derived.hardware.name} "
                "(efficiencies assumed)"
            )
        self.engine = simulated_engine(
            inputs.model_config, settings, strategy, self.timing, self.clock
        )

    def describe(self) -> dict[str, Any]:
        return {"strategy": self.strategy.describe(), SIMULATED: self.basis}

    def replay(self, clock: RunClock, writer: RunWriter, run_dir: Path, progress: bool) -> None:
        del run_dir  # the run's wall clock measures nothing here; its skipped spans are virtual
        requests = requests_of(self.workload)
        stop = stop_rule(self.slo, requests)
        skipped = clock.skipped if self.skip_idle else None
        simulate(
            self.engine, requests, self.workload, self.clock, self.timing.gap_s, writer,
            progress=progress, stop=stop, skipped=skipped,
        )  # fmt: skip

    def flags(self, records: RunRecords) -> list[Flag]:
        del records
        return [
            Flag(
                SIMULATED,
                f"simulated: every step's duration {self.said}; nothing measured",
            )
        ]
