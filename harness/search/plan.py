"""The planner's arithmetic (`servelab plan`): for a hardware preset and a strategy, the weights
of `model`'s shape, the KV memory left beside them (`plan.memory_utilization` of the device)
and the requests of the workload's mean length it holds; the sustained rate per device from
the knee search on simulated runs; the devices a traffic needs, what bounds a device's batch,
and the cost per million output tokens. A prediction, never a measurement, and each row says
what its step times rest on: steps profiled on that GPU (`plan.profiles`: a preset's step
profile, as the GPU check writes one), or its published specifications with stated
efficiencies.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.run.backends.base import peer_inputs
from servelab.harness.run.build import kv_layout
from servelab.harness.run.compose import compose
from servelab.harness.run.schema import checked
from servelab.harness.run.simulate.cost_model import StepCostModel
from servelab.harness.run.simulate.engine import derived_timing, meta_model, simulated_serves
from servelab.harness.run.simulate.hardware import (
    BANDWIDTH_EFFICIENCY,
    COMPUTE_EFFICIENCY,
    STEP_OVERHEAD_S,
    hardware_preset,
    preset_of_device,
)
from servelab.harness.run.spec import engine_spec
from servelab.harness.search.knee_search import search
from servelab.harness.search.probes import RunFn


@dataclass(frozen=True)
class PlanRow:
    hardware: str
    strategy: str
    weight_gb: float
    kv_gb: float
    requests_held: int  # requests of the workload's mean length the KV memory holds
    sustained: float | None  # req/s per device: the knee interval's low end
    devices: int | None  # for plan.rate
    bound: str  # what bounds a device's batch: its KV memory or the step limit
    cost_per_million: float | None  # output tokens, at plan.price_per_hour
    note: str
    basis: str  # what the step times rest on: steps measured on that GPU, or its datasheet


@dataclass(frozen=True)
class PlanSettings:
    hardware: list[str]
    strategies: list[str]
    rate: float
    price_per_hour: float
    memory_utilization: float
    requests: int
    out_dir: Path
    profiles: dict[str, Path]  # preset -> a step profile measured on that GPU

    @classmethod
    def of(cls, cfg: DictConfig) -> PlanSettings:
        node = cfg.plan
        settings = cls(
            hardware=list(checked(node, "plan.hardware")),
            strategies=list(checked(node, "plan.strategies")),
            rate=float(checked(node, "plan.rate")),
            price_per_hour=float(checked(node, "plan.price_per_hour")),
            memory_utilization=float(checked(node, "plan.memory_utilization")),
            requests=checked(node, "plan.requests"),
            out_dir=Path(str(node.out_dir)),
            profiles={str(k): Path(str(v)) for k, v in (node.get("profiles") or {}).items()},
        )
        for name in settings.hardware:
            hardware_preset(name, "plan.hardware")
        for name, path in settings.profiles.items():
            measured_profile(name, path)
        return settings


def measured_profile(preset: str, path: Path) -> StepCostModel:
    """A preset's step profile, checked to be of that GPU (a one-line error otherwise)."""
    field = f"plan.profiles.{preset}"
    hardware = hardware_preset(preset, field)
    try:
        model = StepCostModel.load(path)
    except ConfigError as error:
        raise ConfigError(field, str(error).removeprefix(f"{error.field}: ")) from error
    if preset_of_device(model.measured_on) != preset:
        measured = repr(model.measured_on) if model.measured_on else "a device it does not name"
        raise ConfigError(
            field,
            f"{path} was timed on {measured}, not an {hardware.name}: profile that GPU's steps "
            "(`servelab profile-steps` on it, or the GPU check's step-profile.json)",
        )
    return model


def predicted_line() -> str:
    return (
        "Predicted: simulated runs whose step times come from each row's basis, steps profiled "
        "on that GPU or its published specifications (compute efficiency "
        f"{COMPUTE_EFFICIENCY:.0%}, bandwidth efficiency {BANDWIDTH_EFFICIENCY:.0%}, "
        f"{STEP_OVERHEAD_S * 1e3:g} ms a step); a simulation, not a measurement."
    )


def basis_of(preset: str, cfg: DictConfig, settings: PlanSettings) -> tuple[str, str]:
    """(the override that times a preset's simulated steps, what the row says it rests on),
    for a strategy's config: a preset's step profile must be of the model, dtype, weights
    and heads it serves (a one-line error before any row is planned otherwise)."""
    path = settings.profiles.get(preset)
    if path is None:
        return f"simulate.hardware={preset}", f"datasheet: {hardware_preset(preset).source}"
    measured = measured_profile(preset, path)
    engine = engine_spec(cfg)
    served = simulated_serves(engine.settings, engine.strategy, engine.model.name)
    measured.check_describes(served, f"plan.profiles.{preset}")
    return f"simulate.cost_model={path}", f"measured: steps profiled on {measured.measured_on}"


def plan_row(
    overrides: list[str],
    preset: str,
    strategy: str,
    settings: PlanSettings,
    run: RunFn,
    basis: tuple[str, str],
) -> PlanRow:
    """One preset and strategy: the memory arithmetic, then the knee search on simulated runs
    (each run by `run`, which the command supplies) timed as `basis` says (`basis_of`)."""
    cfg = compose([*overrides, f"strategy={strategy}"])
    spec = engine_spec(cfg)
    engine, model_spec = spec.settings, spec.model
    model = meta_model(model_spec, spec.strategy)
    timing = derived_timing(hardware_preset(preset), model, engine.dtype)
    kv_bytes = settings.memory_utilization * timing.hardware.memory_bytes - timing.weight_bytes
    requests = peer_inputs(model_spec, cfg.workload).workload.requests
    mean_tokens = statistics.mean(len(r.prompt_ids) + r.max_tokens for r in requests)
    mean_output = statistics.mean(r.max_tokens for r in requests)
    held = int(max(kv_bytes, 0) // (kv_layout(model, engine.dtype).bytes_per_token * mean_tokens))
    timed_by, said = basis
    row = PlanRow(preset, strategy, timing.weight_bytes / 1e9, max(kv_bytes, 0) / 1e9, held,
                  None, None, "memory", None, "", said)  # fmt: skip
    if held < 1:
        return _with(row, note="the weights leave no room for one request's KV")
    searched = [
        *overrides, "backend=simulated", timed_by,
        f"engine.kv_budget={int(kv_bytes)}", f"search.strategies=[{strategy}]",
        f"search.out_dir={settings.out_dir / preset}", "search.budget_s=1e9",
        f"search.requests={settings.requests}", f"search.max_requests={2 * settings.requests}",
        f"search.ceiling_requests={settings.requests}",  # enough at once to fill a device
    ]  # fmt: skip
    (knee,) = search(searched, compose, run).knees
    bound = f"memory ({held} requests)"
    if held >= engine.max_batch_size:
        bound = f"step limit ({engine.max_batch_size} a batch)"
    if not knee.low:
        return _with(row, bound=bound, note=knee.note or "no rate is sustained")
    devices = math.ceil(settings.rate / knee.low)
    cost = devices * settings.price_per_hour / (settings.rate * mean_output * 3600) * 1e6
    return _with(row, sustained=knee.low, devices=devices, bound=bound,
                 cost_per_million=cost, note=knee.note)  # fmt: skip


def _with(row: PlanRow, **changes: object) -> PlanRow:
    return PlanRow(**{**asdict(row), **changes})


def spread_line(rows: list[PlanRow], rate: float) -> str | None:
    """The seeds' question in one line: the fewest and the most devices for this traffic."""
    counted = [r for r in rows if r.devices is not None]
    if len(counted) < 2:
        return None
    fewest = min(counted, key=lambda r: r.devices or 0)
    most = max(counted, key=lambda r: r.devices or 0)
    if fewest.devices == most.devices:
        return f"{rate:g} req/s: {fewest.devices} devices whichever preset and strategy"
    return (
        f"{rate:g} req/s: {fewest.devices} x {fewest.hardware} under {fewest.strategy}, or "
        f"{most.devices} x {most.hardware} under {most.strategy}"
    )
