"""One run, end to end: validate, load, build the workload and engine, replay, record, summarise.

`run` reads the composed config once (`spec.run_spec`); everything below takes its typed parts.

The `backend` decides what serves the workload: servelab's engine in this process (built
here), or a peer (`harness.runner.backends`); every backend is measured the same way here.

Every check of the input happens before the model is placed or the clock starts, so bad
input costs seconds and a clear line. Once the run starts, everything measured is written
as it happens; a failure mid-run still leaves the records, every request in flight written
as failed, and a summary marked failed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord
from servelab.engine.engine import Engine
from servelab.engine.request import Request
from servelab.harness.measure.calibrate import Peaks, provenance, remeasure_if_beaten
from servelab.harness.measure.flags import (
    PEAKS_BEATEN,
    SIMULATED,
    TEST_STEP_DELAY,
    Flag,
    add_flags,
    busy_machine,
    in_flight_spans,
    step_dropouts,
    summary_flags,
    telemetry_dropouts,
)
from servelab.harness.measure.load_generator import load_generator
from servelab.harness.measure.meta import collect_meta
from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.profiling import StepProfiler
from servelab.harness.measure.rundir import SCHEMA_VERSION, RunRecords, RunWriter
from servelab.harness.measure.server_metrics import FILE as SERVER_METRICS
from servelab.harness.measure.server_metrics import server_metrics_summary
from servelab.harness.measure.slo.early_stop import StoppedEarly, StopRecord, stop_rule
from servelab.harness.measure.telemetry import NoTelemetry, TelemetryResult, TelemetrySampler
from servelab.harness.measure.weights_quality import read_quality, weights_summary
from servelab.harness.runner.backends import ENGINE_LOOPS, SERVED_HERE
from servelab.harness.runner.backends.base import Backend
from servelab.harness.runner.backends.managed_server import running_server
from servelab.harness.runner.build import ServedModel
from servelab.harness.runner.clock import RunClock
from servelab.harness.runner.collector import collector_paused
from servelab.harness.runner.replay import replay, requests_of
from servelab.harness.runner.settings import EngineSettings, dtype_name
from servelab.harness.runner.spec import RunRecord, RunSpec, config_hash, run_spec
from servelab.harness.runner.startup import Started, start_engine
from servelab.harness.runner.step_delay import delay_flag
from servelab.harness.runner.warmup import Warmup, warm_up, warmup_shapes
from servelab.kernels.int4_matmul import Int4Kernel
from servelab.kernels.paths import RunKernels, kernel_record
from servelab.workloads.build import build_workload
from servelab.workloads.spec import Workload


@dataclass
class Prepared:
    """Everything a run needs, validated and built, before the clock starts."""

    started: Started
    workload: Workload
    requests: list[Request]  # the workload's, as the engine serves them
    warmup: Warmup | None  # None: engine.warmup=false

    @property
    def engine(self) -> Engine:
        return self.started.engine

    @property
    def served(self) -> ServedModel:
        return self.started.served


def prepare(spec: RunSpec, clock: Callable[[], float], progress: bool = True) -> Prepared:
    started = start_engine(spec.engine_or_fail(), clock, progress)
    workload = build_workload(
        spec.workload, started.tokenizer, started.served.loaded.config.max_context
    )
    requests = requests_of(workload)
    check_workload(requests, started.engine)
    warmup = None
    if started.settings.warmup:
        shapes = warmup_shapes(
            min(started.settings.max_batch_size, len(requests)),
            max((len(r.prompt_ids) for r in requests), default=0),
            started.settings.max_num_batched_tokens,
        )
        vocab = started.served.loaded.config.vocab_size
        warmup = warm_up(started.engine, vocab, shapes, progress)
    return Prepared(started, workload, requests, warmup)


def check_workload(requests: list[Request], engine: Engine) -> None:
    """Refuse, before any work, a workload this engine cannot serve at all.

    A prompt the strategy's step budget can never take is a configuration error; a request
    that can never fit the KV cache is rejected when it arrives and recorded, unless no
    request of the workload fits, which leaves nothing to measure."""
    refused = []
    for request in requests:
        rejection = engine.rejection(request)
        if rejection is not None and rejection.limit is not None:
            raise rejection.limit
        if rejection is not None:
            refused.append((request.id, rejection.reason))
    if refused and len(refused) == len(requests):
        rid, reason = refused[0]
        raise ConfigError(
            "engine.kv_budget",
            f"no request can be served: request {rid} {reason}; raise engine.kv_budget or "
            "shorten the requests",
        )


def completed_summary(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The summary of an earlier complete (or stopped early: its verdict is known) run of this
    same config in `run_dir`, if any."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    same = summary.get("config_hash") == config_hash(cfg)
    return summary if same and summary.get("status") in ("complete", "stopped") else None


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


def peer_backend(spec: RunSpec, progress: bool) -> Backend:
    """A prepared peer backend: everything checked and loaded, nothing sent yet."""
    if spec.backend == "openai":
        from servelab.harness.runner.backends.endpoint import EndpointBackend

        return EndpointBackend.prepare(spec)
    if spec.backend == "simulated":
        from servelab.harness.simulate.backend import SimulatedBackend

        return SimulatedBackend(spec)
    from servelab.harness.runner.backends.hf_backend import HFBackend

    return HFBackend.prepare(spec, continuous=spec.backend == "hf_continuous", progress=progress)


def run(cfg: DictConfig, run_dir: Path, progress: bool = True) -> dict:
    """Execute one configured run into `run_dir`; returns the summary. `cfg` is read here,
    once, and checked whole before anything loads; a server the run starts (`server=NAME`)
    answers before the run's clock starts and is stopped after, however the run ends."""
    spec = run_spec(cfg)
    if spec.server is None or spec.endpoint is None:
        return run_spec_into(spec, run_dir, progress)
    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    with running_server(spec.server, run_dir, say) as server:
        label = spec.endpoint.label or spec.server.label
        endpoint = replace(spec.endpoint, url=server.url, label=label)
        return run_spec_into(replace(spec, endpoint=endpoint), run_dir, progress)


def run_spec_into(spec: RunSpec, run_dir: Path, progress: bool = True) -> dict:
    """Execute the run `spec` describes into `run_dir`; returns the summary."""
    clock = RunClock()
    record = spec.record
    if spec.backend == "inprocess":
        backend: Backend = InProcessBackend(prepare(spec, clock, progress), spec)
    else:
        backend = peer_backend(spec, progress)
    writer = RunWriter(run_dir, keep=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(record.config))
    meta = collect_meta(
        record.config,
        backend.model_file,
        backend.model_sha256,
        backend.workload.hash,
        backend.seeds,
        backend.device,
    )
    meta.update(backend.describe())
    meta["workload_name"] = backend.workload.name
    meta["workload_requests"] = len(backend.workload.requests)  # `summarize` counts the missing
    writer.json("meta.json", meta)
    sampler: TelemetrySampler | NoTelemetry = (
        NoTelemetry(backend.no_telemetry)
        if backend.no_telemetry
        else TelemetrySampler(
            run_dir / "telemetry.csv", record.telemetry_period_s, clock, backend.device
        )
    )
    clock.zero()
    sampler.start()
    error: str | None = None
    stopped: StopRecord | None = None
    try:
        backend.replay(clock, writer, run_dir, progress)
    except StoppedEarly as stop:
        stopped = stop.record
    except Exception as exc:  # the records so far are kept; the summary says what happened
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        with collector_paused():  # the records kept for the summary: millions of objects
            telemetry = sampler.stop()
            writer.close()
            served = meta["strategy"]
            if spec.backend in ENGINE_LOOPS:  # the strategy node as configured, every key
                served = record.strategy
            workload = backend.workload
            records = writer.written()
            summary = summary_for(
                run_dir,
                records,
                record,
                (workload.name, workload.hash, len(workload.requests)),
                telemetry,
                error,
                meta.get("peaks"),
                served,
            )
            if clock.skipped:
                summary["idle_skipped"] = {"spans": len(clock.skipped), "s": clock.skipped_s}
            if stopped is not None:
                summary["status"] = "stopped"
                summary["stopped_early"] = stopped.as_dict()
            add_flags(summary, backend.flags(records))
            if "weights" in meta:
                summary["weights"] = meta["weights"]
            for key in ("dtype", SIMULATED):
                if key in meta:
                    summary[key] = meta[key]
            writer.json("summary.json", summary)
    return summary


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


def summary_for(
    run_dir: Path,
    records: RunRecords,
    record: RunRecord,
    workload: tuple[str, str, int | None],
    telemetry: TelemetryResult,
    error: str | None,
    peaks: dict | None,
    strategy: dict,
) -> dict:
    """The summary of the run in `run_dir` from its records; `workload` is its name, hash and
    how many requests it planned (None: not known)."""
    requests, steps = records.requests, records.steps
    name, workload_hash, planned = workload
    summary = {
        "schema": SCHEMA_VERSION,
        "strategy": strategy,
        "workload": name,
        "workload_hash": workload_hash,
        "model": record.model_name,
        "config_hash": record.config_hash,
        "status": "failed" if error else "complete",
        "error": error,
    }
    summary.update(summarize(requests, steps, record.slo, peaks))
    summary["not_recorded"] = None if planned is None else planned - len(requests)
    summary["telemetry"] = {
        "source": telemetry.source,
        "samples": telemetry.samples,
        "note": telemetry.note,
    }
    if record.backend == "openai":  # a client sent the requests: was it on time?
        summary["load_generator"] = load_generator(requests, record.arrival).as_dict()
        summary["server_metrics"] = server_metrics_summary(run_dir / SERVER_METRICS)
    summary["energy_j"] = telemetry.energy_j
    tokens = summary["output_tokens"]
    summary["j_per_token"] = telemetry.energy_j / tokens if telemetry.energy_j and tokens else None
    flags = summary_flags(summary) + step_dropouts(steps)
    spans = in_flight_spans(requests)
    flags += telemetry_dropouts(run_dir / "telemetry.csv", record.telemetry_period_s, spans)
    if record.backend in SERVED_HERE:  # a peer server is one of the other processes
        flags += busy_machine(run_dir / "telemetry.csv", spans)
    delay = record.step_delay_s
    if delay > 0:
        summary["test_step_delay_s"] = delay
        flags.append(Flag(TEST_STEP_DELAY, delay_flag(delay)))
    add_flags(summary, flags)
    return summary
