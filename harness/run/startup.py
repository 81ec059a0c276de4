"""Start-up: from an `EngineSpec` to a built engine, the one sequence everything uses.

Runs, the HTTP server, the soak script and the benchmarks all start an engine here, in the
same order (`engine_spec` made every cheap check before anything loads): the seed, the model as
the strategy serves it, a draft model if the strategy drafts with one, the tokenizer, (unless
`telemetry.roofline=false`) this machine's calibrated peaks for the roofline counters, then
the engine: calibration runs before the KV cache is allocated, so its buffers fit beside
the weights even when the KV cache is to take nearly all the memory left. `step_hooks` are
the hooks every engine loop runs with, so a server's `steps.jsonl` carries the same flops,
bytes, MFU and MBU as an in-process run's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from servelab.engine.engine import Engine
from servelab.engine.model_runner import ModelRunner
from servelab.engine.step_update import StepResult
from servelab.harness.measure.calibrate import Peaks, measure_peaks
from servelab.harness.measure.roofline import ModelShape, StepRoofline
from servelab.harness.run.build import ServedModel, build_engine, load_for_strategy
from servelab.harness.run.draft import load_draft
from servelab.harness.run.loop import StepHook
from servelab.harness.run.settings import EngineSettings
from servelab.harness.run.spec import EngineSpec
from servelab.harness.run.step_delay import StepDelay
from servelab.models.load import tokenizer_for
from servelab.strategies.settings import StrategySettings


@dataclass
class Started:
    """An engine and what it was built from."""

    settings: EngineSettings
    strategy: StrategySettings
    served: ServedModel
    tokenizer: PreTrainedTokenizerBase
    engine: Engine
    roofline: StepRoofline | None  # None: telemetry.roofline=false
    step_delay_s: float  # the test-only delay before every step (0: none)

    def step_hooks(self) -> list[StepHook]:
        """The hooks every loop over this engine runs: roofline counters, the GPU time of each
        forward on CUDA, the test delay."""
        hooks: list[StepHook] = []
        if self.roofline is not None:
            hooks.append(RooflineHook(self.roofline))
        if self.settings.device.type == "cuda" and isinstance(self.engine.runner, ModelRunner):
            hooks.append(GpuTimeHook(self.engine.runner))
        if self.step_delay_s > 0:
            hooks.append(StepDelay(self.step_delay_s))
        return hooks


def start_engine(spec: EngineSpec, clock: Callable[[], float], progress: bool = True) -> Started:
    """The engine `spec` describes (`engine_spec` made every check that needs nothing loaded)."""
    settings, strategy = spec.settings, spec.strategy
    torch.manual_seed(settings.seed)
    served = load_for_strategy(spec.model, settings, strategy, progress)
    draft_model = load_draft(spec.draft, settings, strategy, served, progress)
    tokenizer = served.loaded.tokenizer or tokenizer_for(spec.model)
    roofline = None
    if spec.roofline:  # before the KV cache takes the memory it measures in
        peaks = measure_peaks(settings.device, settings.dtype, spec.cache_dir)
        roofline = roofline_of(served, settings, peaks)
    engine = build_engine(served.model, settings, strategy, clock, draft_model)
    return Started(settings, strategy, served, tokenizer, engine, roofline, spec.step_delay_s)


def roofline_of(served: ServedModel, settings: EngineSettings, peaks: Peaks) -> StepRoofline:
    shape = ModelShape.of(served.loaded.config)
    element = torch.empty((), dtype=settings.dtype).element_size()
    return StepRoofline(
        shape, served.weight_bytes, element, element, served.model.kv_heads_stored, peaks
    )


class RooflineHook:
    """Annotates every step record with the FLOPs and bytes its batch required."""

    def __init__(self, roofline: StepRoofline) -> None:
        self.roofline = roofline

    def step_started(self, step: int) -> None:
        del step

    def step_finished(self, result: StepResult) -> None:
        if result.record.num_seqs:
            self.roofline.annotate(result.record)


class GpuTimeHook:
    """Puts each step's forward time on the GPU (CUDA events) beside its wall-clock `model_s`,
    as the record's `gpu_s` counter."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner

    def step_started(self, step: int) -> None:
        del step

    def step_finished(self, result: StepResult) -> None:
        if result.record.num_seqs:  # the step ran a forward
            seconds = self.runner.gpu_seconds()
            if seconds is not None:
                result.record.counters["gpu_s"] = seconds
