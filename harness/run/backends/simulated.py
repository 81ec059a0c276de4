"""`backend=simulated`: a workload replayed on the simulated engine (`harness.run.simulate`),
in virtual time, each step's duration predicted, nothing measured.

The run directory, summary and report are a real run's, marked as simulated in `meta.json`, the
summary's `simulated` entry and its flags. Speculative decoding is refused: its accepted
lengths come from the model's tokens, which a simulation does not compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import SIMULATED, Flag
from servelab.harness.measure.rundir import RunRecords, RunWriter
from servelab.harness.measure.slo.early_stop import stop_rule
from servelab.harness.run.backends.base import Backend, peer_inputs
from servelab.harness.run.clock import RunClock
from servelab.harness.run.replay import requests_of
from servelab.harness.run.simulate.cost_model import StepCostModel
from servelab.harness.run.simulate.engine import (
    derived_timing,
    fitted_record,
    meta_model,
    simulated_engine,
    simulated_serves,
)
from servelab.harness.run.simulate.hardware import hardware_preset
from servelab.harness.run.simulate.replay import simulate
from servelab.harness.run.simulate.runner import StepTime, VirtualClock
from servelab.harness.run.spec import RunSpec
from servelab.strategies.decoding.speculative import SpeculativeConfig


class SimulatedBackend(Backend):
    no_telemetry = (
        "simulated: its clock is virtual, and the machine running it is not the one it predicts"
    )

    @classmethod
    def prepare(cls, spec: RunSpec, clock: RunClock, progress: bool) -> SimulatedBackend:
        del clock, progress  # its clock is its own, virtual; nothing loads
        return cls(spec)

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
        self.serves(inputs, torch.device("cpu"), spec.seeds)  # where the simulation runs
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
