"""`backend=inprocess`: servelab's own engine under the configured strategy, built before the
clock starts (`harness.run.prepare`) and replayed in this process; what it describes in
`meta.json` (dtype, kernels, CUDA graphs, weights, peaks, warm-up) and its own flag (a step
that beat the calibrated peaks).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from servelab.base.records import StepRecord
from servelab.harness.checks.profiling import StepProfiler
from servelab.harness.measure.calibrate import Peaks, provenance, remeasure_if_beaten
from servelab.harness.measure.flags import PEAKS_BEATEN, Flag
from servelab.harness.measure.rundir import RunRecords, RunWriter
from servelab.harness.measure.slo.early_stop import stop_rule
from servelab.harness.measure.weights_quality import read_quality, weights_summary
from servelab.harness.run.backends.base import Backend
from servelab.harness.run.clock import RunClock
from servelab.harness.run.prepare import Prepared, prepare
from servelab.harness.run.replay import replay
from servelab.harness.run.settings import EngineSettings, dtype_name
from servelab.harness.run.spec import RunSpec
from servelab.kernels.int4_matmul import Int4Kernel
from servelab.kernels.paths import RunKernels, kernel_record


class InProcessBackend(Backend):
    """servelab's own engine under the configured strategy, replayed in this process."""

    def __init__(self, prepared: Prepared, spec: RunSpec) -> None:
        self.prepared = prepared
        self.spec = spec
        self.cache_dir = spec.engine_or_fail().cache_dir
        self.workload = prepared.workload
        self.device = prepared.started.settings.device
        self.model_file = prepared.served.loaded.path
        self.model_sha256 = prepared.served.loaded.sha256
        self.seeds = spec.seeds
        roofline = prepared.started.roofline
        self.peaks = roofline.peaks if roofline else None

    @classmethod
    def prepare(cls, spec: RunSpec, clock: RunClock, progress: bool) -> InProcessBackend:
        return cls(prepare(spec, clock, progress), spec)

    def describe(self) -> dict:
        settings = self.prepared.started.settings
        return {
            "dtype": {"name": dtype_name(settings.dtype), "reason": settings.dtype_reason},
            "device_fallback": settings.device_fallback,
            "kernels": kernel_record(run_kernels(self.prepared)),
            "cuda_graphs": asdict(self.prepared.engine.runner.graphs_record),
            "strategy": self.prepared.started.strategy.describe(),
            "weight_bytes": self.prepared.served.weight_bytes,
            "weights": served_weights_summary(self.prepared, self.cache_dir),
            "peaks": peaks_record(self.peaks, self.cache_dir) if self.peaks else None,
            "warmup": None if self.prepared.warmup is None else self.prepared.warmup.as_dict(),
        }

    def replay(self, clock: RunClock, writer: RunWriter, run_dir: Path, progress: bool) -> None:
        profile = self.spec.profile
        profiler = StepProfiler(
            enabled=profile.enabled,
            first_step=profile.first_step,
            num_steps=profile.num_steps,
            out_dir=run_dir,
        )
        hooks = [profiler, *self.prepared.started.step_hooks()]
        engine, requests = self.prepared.engine, self.prepared.requests
        try:
            stop = stop_rule(self.spec.slo, requests)
            skip = clock if self.spec.skip_idle else None
            replay(engine, requests, self.workload, clock, writer, hooks, progress, stop, skip)
        finally:
            profiler.close()

    def flags(self, records: RunRecords) -> list[Flag]:
        if self.peaks is None:
            return []
        settings = self.prepared.started.settings
        beaten = check_peaks(self.peaks, records.steps, settings, self.cache_dir)
        return [Flag(PEAKS_BEATEN, text) for text in beaten]


def run_kernels(prepared: Prepared) -> RunKernels:
    """What the dispatch of this run's engine depends on (for `meta.json`'s `kernels`)."""
    engine, settings = prepared.engine, prepared.started.settings
    model = engine.runner.model
    return RunKernels(
        device=settings.device,
        dtype=settings.dtype,
        attention_impl=engine.runner.attention.impl,
        fused_layer=model.layer_runner is not None,
        fused_setting=settings.fused_decode,
        int4_kernels=tuple(
            module.kernel.name
            for module in model.modules()
            if isinstance(getattr(module, "kernel", None), Int4Kernel)
        ),
    )


def served_weights_summary(prepared: Prepared, cache_dir: Path) -> dict:
    """The weights the run served: option, bytes, how made, recorded quality."""
    served = prepared.served
    return weights_summary(
        prepared.started.strategy.weights.value,
        served.weights_id,
        served.weight_bytes,
        served.weights.record(),
        read_quality(cache_dir, served.weights_id),
    )


def peaks_record(peaks: Peaks, cache_dir: Path) -> dict:
    """The peaks a run divides by, with when each was measured and under what load."""
    return {
        "matmul_flops_per_s": peaks.matmul_flops_per_s,
        "copy_bytes_per_s": peaks.copy_bytes_per_s,
        "device": peaks.device,
        "dtype": peaks.dtype,
        "measured": provenance(cache_dir, peaks),
    }


def check_peaks(
    peaks: Peaks, steps: list[StepRecord], settings: EngineSettings, cache_dir: Path
) -> list[str]:
    """When a step beat a calibrated peak, measure again (for later runs) and say so."""
    timed = [s for s in steps if s.model_s > 0 and "flops" in s.counters]
    if not timed:
        return []
    flops = max(s.counters["flops"] / s.model_s for s in timed)
    moved = max(s.counters["bytes"] / s.model_s for s in timed)
    raised = remeasure_if_beaten(settings.device, settings.dtype, cache_dir, peaks, flops, moved)
    if raised is None:
        return []
    return [
        f"steps beat the calibrated peaks (reached {flops / 1e9:.0f} GFLOP/s and "
        f"{moved / 1e9:.0f} GB/s against {peaks.matmul_flops_per_s / 1e9:.0f} and "
        f"{peaks.copy_bytes_per_s / 1e9:.0f}): MFU/MBU read high; re-measured for later runs: "
        f"{raised.matmul_flops_per_s / 1e9:.0f} GFLOP/s, {raised.copy_bytes_per_s / 1e9:.0f} GB/s"
    ]
