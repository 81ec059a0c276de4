"""One run's configuration, parsed once into frozen parts that everything below `run` takes.

Hydra composes a loose tree; `run_spec` reads it once, checks every field before any work
(a `ConfigError` names the field and the fix) and hands typed parts down: the engine to build
(`EngineSpec`), the workload, the SLO, the backend's settings, telemetry and profiling. Nothing
under `run` reads the raw config again. `RunRecord` is the part a summary reads: it parses a
run directory's recorded `config.yaml` on any machine, since it resolves nothing local.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from servelab.base.errors import ConfigError
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.backends import KINDS, backend_of
from servelab.harness.run.backends.endpoint_settings import EndpointSettings, endpoint_settings
from servelab.harness.run.draft import draft_model_of
from servelab.harness.run.schema import checked
from servelab.harness.run.servers.settings import ServerSettings, server_settings
from servelab.harness.run.settings import (
    EngineSettings,
    engine_settings,
    model_of,
)
from servelab.harness.run.step_delay import step_delay_s
from servelab.models.spec import ModelSpec
from servelab.strategies.settings import StrategySettings, strategy_settings
from servelab.workloads.arrivals import ArrivalSpec, parse_arrival_spec
from servelab.workloads.cache_bust import resolved
from servelab.workloads.config import WorkloadConfig, parse_workload_config


@dataclass(frozen=True)
class EngineSpec:
    """What builds an engine: every check that needs nothing loaded, done."""

    settings: EngineSettings
    strategy: StrategySettings
    step_delay_s: float  # the test-only delay before every step (0: none)
    model: ModelSpec
    draft: ModelSpec | None  # the second model a strategy drafts with
    roofline: bool  # measure this machine's peaks for the roofline counters (telemetry.roofline)

    @property
    def cache_dir(self) -> Path:
        """Model files and measured peaks (`engine.cache_dir`), where the model is kept."""
        return self.model.cache_dir


def engine_spec(cfg: DictConfig) -> EngineSpec:
    """The engine `cfg` describes: engine and strategy settings, the test delay, the model,
    the draft model checked against the target."""
    settings = engine_settings(cfg.engine)
    strategy = strategy_settings(cfg.strategy)
    delay = step_delay_s(cfg.engine)
    model = model_of(cfg)
    draft = draft_model_of(model, strategy)
    roofline = checked(cfg.telemetry, "telemetry.roofline", True)
    return EngineSpec(settings, strategy, delay, model, draft, roofline)


@dataclass(frozen=True)
class RunRecord:
    """What a run's summary reads of its config (from a recorded `config.yaml` too)."""

    config: dict[str, Any]  # the resolved config: config.yaml, meta.json
    config_hash: str  # sha256 of the resolved config: whether two runs are the same run
    backend: str
    model_name: str
    slo: SLO
    arrival: ArrivalSpec
    telemetry_period_s: float
    step_delay_s: float

    @property
    def strategy(self) -> dict[str, Any]:
        """The strategy node as configured, every key."""
        return self.config.get("strategy") or {}


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the resolved configuration: what decides whether two runs are the same run."""
    text = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def run_record(cfg: DictConfig) -> RunRecord:
    config = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config, dict)
    return RunRecord(
        config=config,
        config_hash=config_hash(cfg),
        backend=backend_of(cfg),
        model_name=str(cfg.model.get("name")),
        slo=SLO.of_config(cfg),
        arrival=parse_arrival_spec(cfg.workload.get("arrival"), "workload.arrival"),
        telemetry_period_s=float(checked(cfg.telemetry, "telemetry.period_s")),
        step_delay_s=step_delay_s(cfg.engine),
    )


@dataclass(frozen=True)
class ProfileSettings:
    enabled: bool  # a torch.profiler Chrome trace over a window of steps
    first_step: int
    num_steps: int


@dataclass(frozen=True)
class SimulateSettings:
    """`backend=simulated`: each step's time from a fitted model file or a GPU preset."""

    cost_model: Path | None
    hardware: str | None


@dataclass(frozen=True)
class RunSpec:
    record: RunRecord
    workload: WorkloadConfig
    engine: EngineSpec | None  # None: a server elsewhere serves (backend=openai)
    endpoint: EndpointSettings | None  # backend=openai
    server: ServerSettings | None  # a server the run starts (`server=NAME`), backend=openai
    simulate: SimulateSettings | None  # backend=simulated
    skip_idle: bool  # replay.skip_idle
    profile: ProfileSettings
    model: ModelSpec  # the model whose tokenizer and context shape the workload
    seeds: dict[str, int]

    @property
    def backend(self) -> str:
        return self.record.backend

    @property
    def slo(self) -> SLO:
        return self.record.slo

    def engine_or_fail(self) -> EngineSpec:
        if self.engine is None:
            raise ConfigError("backend", f"backend={self.backend} builds no engine")
        return self.engine


def run_spec(cfg: DictConfig) -> RunSpec:
    """`cfg` checked, the SLO first, then what the backend reads; one line for the first
    field at fault, before anything loads. A `workload.cache_bust` of true becomes this run's
    nonce first, so that the run's config records it."""
    with open_dict(cfg.workload):
        cfg.workload.cache_bust = resolved(cfg.workload.get("cache_bust"))
    record = run_record(cfg)
    name, kind = record.backend, KINDS[record.backend]
    skip_idle = checked(cfg.replay, "replay.skip_idle")
    if skip_idle and not kind.runs_engine:  # a simulation's clock is virtual
        raise ConfigError("replay.skip_idle", f"in-process runs only; backend={name} serves")
    if record.slo.stop_early is not None and not kind.stops_early:
        stopping = ", ".join(n for n, k in KINDS.items() if k.stops_early)
        raise ConfigError("slo.stop_early", f"not with backend={name}: {stopping}")
    workload = parse_workload_config(cfg.workload)
    profile = cfg.profile
    engine = None if kind.over_http else engine_spec(cfg)
    model = model_of(cfg) if engine is None else engine.model
    server = server_settings(cfg, model)
    if server is not None and not kind.over_http:
        raise ConfigError("server", f"a started server is measured over HTTP, not backend={name}")
    return RunSpec(
        record=record,
        workload=workload,
        engine=engine,
        endpoint=endpoint_settings(cfg.endpoint) if kind.over_http else None,
        server=server,
        simulate=simulate_settings(cfg.get("simulate") or {}) if name == "simulated" else None,
        skip_idle=skip_idle,
        profile=ProfileSettings(
            checked(profile, "profile.enabled"),
            checked(profile, "profile.first_step"),
            checked(profile, "profile.num_steps"),
        ),
        model=model,
        seeds={"engine": checked(cfg.engine, "engine.seed", 0), "workload": workload.seed},
    )


def simulate_settings(node: Mapping[str, Any]) -> SimulateSettings:
    path, preset = node.get("cost_model"), node.get("hardware")
    if bool(path) == bool(preset):
        raise ConfigError(
            "simulate",
            "backend=simulated needs one of simulate.cost_model (a fitted model file) or "
            "simulate.hardware (a GPU preset: harness/run/simulate/hardware.py)",
        )
    return SimulateSettings(
        cost_model=Path(str(path)) if path else None, hardware=str(preset) if preset else None
    )
