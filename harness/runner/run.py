"""One run, end to end: validate, load, build the workload and engine, replay, record, summarise.

Every check of the input happens before the model is placed or the clock starts, so bad
input costs seconds and a clear line. Once the run starts, everything measured is written
as it happens; a failure mid-run still leaves the records and a summary marked failed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from harness.engine.engine import Engine
from harness.engine.kv_cache import KVLayout, allocate_kv_cache
from harness.engine.kv_manager import KVManager
from harness.errors import ConfigError
from harness.measure.calibrate import Peaks, measure_peaks
from harness.measure.meta import collect_meta
from harness.measure.metrics import SLO, summarize
from harness.measure.profiling import StepProfiler
from harness.measure.roofline import ModelShape, StepRoofline, run_utilisation
from harness.measure.rundir import SCHEMA_VERSION, RunWriter, read_jsonl
from harness.measure.telemetry import TelemetryResult, TelemetrySampler
from harness.models.load import LoadedModel, load_model, tokenizer_for
from harness.runner.replay import replay, to_request
from harness.runner.settings import (
    EngineSettings,
    StrategySettings,
    cache_dir_of,
    engine_settings,
    strategy_settings,
)
from kernels.attention import Attention, AttentionConfig
from reports.run_report import build_run_report
from strategies.assemble import build_kv_manager, build_scheduler, kv_block_size
from strategies.batching.base import SchedulerLimits
from strategies.heads import HeadLayout, convert_checkpoint
from workloads.build import build_workload
from workloads.spec import Workload


@dataclass
class Prepared:
    """Everything a run needs, validated and built, before the clock starts."""

    engine_cfg: EngineSettings
    strategy: StrategySettings
    loaded: LoadedModel
    workload: Workload
    engine: Engine


def slo_of(cfg: DictConfig) -> SLO:
    node = cfg.get("slo") or {}
    return SLO(node.get("ttft_s"), node.get("tpot_s"), node.get("e2e_s"))


def kv_budget_bytes(settings: EngineSettings) -> int:
    if settings.kv_budget_bytes is not None:
        return settings.kv_budget_bytes
    free, _ = torch.cuda.mem_get_info(settings.device)
    return int(free * settings.kv_budget_fraction)


def load_with_head_layout(cfg: DictConfig, settings: EngineSettings, heads: str) -> LoadedModel:
    """The configured model with the strategy's head layout applied (converted or repeated)."""
    layout = HeadLayout.parse(heads)
    loaded = load_model(
        cfg.model,
        settings.dtype,
        settings.device,
        cache_dir_of(cfg),
        transform=lambda checkpoint: convert_checkpoint(checkpoint, layout),
    )
    layout.apply(loaded.model)
    return loaded


def prepare(cfg: DictConfig, clock: Callable[[], float]) -> Prepared:
    settings = engine_settings(cfg.engine)
    strategy = strategy_settings(cfg.strategy)
    torch.manual_seed(settings.seed)
    loaded = load_with_head_layout(cfg, settings, strategy.heads)
    tokenizer = loaded.tokenizer or tokenizer_for(cfg.model, cache_dir_of(cfg))
    workload = build_workload(cfg.workload, tokenizer, loaded.config.max_context)
    model_cfg = loaded.config
    kv_layout = KVLayout(
        num_layers=model_cfg.num_layers,
        stored_kv_heads=loaded.model.kv_heads_stored,
        head_dim=model_cfg.head_dim,
        dtype=settings.dtype,
    )
    block_size = kv_block_size(strategy)
    cache = allocate_kv_cache(kv_layout, kv_budget_bytes(settings), block_size, settings.device)
    kv = build_kv_manager(strategy, cache)
    check_requests_fit(workload, kv, cache.num_slots, kv_layout.bytes_per_token)
    limits = SchedulerLimits(
        max_num_seqs=settings.max_batch_size,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        chunked_prefill=strategy.chunked_prefill,
    )
    scheduler = build_scheduler(strategy, kv, limits)
    attention = Attention(AttentionConfig(impl=settings.attention), settings.device)
    roofline = None
    if cfg.telemetry.get("roofline", True):
        peaks = measure_peaks(settings.device, settings.dtype, cache_dir_of(cfg))
        roofline = roofline_of(loaded, settings, peaks)
    engine = Engine(
        loaded.model,
        cache,
        scheduler,
        attention,
        settings.device,
        clock,
        model_cfg.max_context,
        roofline,
    )
    return Prepared(settings, strategy, loaded, workload, engine)


def roofline_of(loaded: LoadedModel, settings: EngineSettings, peaks: Peaks) -> StepRoofline:
    config = loaded.config
    shape = ModelShape(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        tie_embeddings=config.tie_embeddings,
    )
    model = loaded.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not config.tie_embeddings:  # an untied input table is only gathered at a few rows
        embedding = model.embed_tokens.weight
        weight_bytes -= embedding.numel() * embedding.element_size()
    element = torch.empty((), dtype=settings.dtype).element_size()
    return StepRoofline(shape, weight_bytes, element, element, model.kv_heads_stored, peaks)


def check_requests_fit(workload: Workload, kv: KVManager, total_slots: int, per_token: int) -> None:
    for index, spec in enumerate(workload.requests):
        request = to_request(spec, index)
        if not kv.fits_empty(request):
            need = request.max_total_tokens
            raise ConfigError(
                "engine.kv_budget",
                f"request {spec.id} needs {need} tokens of KV ({need * per_token} bytes) but the "
                f"budget holds {total_slots} tokens; raise engine.kv_budget or shorten the request",
            )


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the resolved configuration: what decides whether two runs are the same run."""
    text = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def completed_summary(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The summary of an earlier complete run of this same config in `run_dir`, if any."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    same = summary.get("config_hash") == config_hash(cfg)
    return summary if same and summary.get("status") == "complete" else None


def run(cfg: DictConfig, run_dir: Path, progress: bool = True) -> dict:
    """Execute one configured run into `run_dir`; returns the summary."""
    start = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - start

    prepared = prepare(cfg, clock)
    settings = prepared.engine_cfg
    writer = RunWriter(run_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    meta = collect_meta(
        OmegaConf.to_container(cfg, resolve=True),
        prepared.loaded.path,
        prepared.loaded.sha256,
        prepared.workload.hash,
        {"engine": settings.seed, "workload": int(cfg.workload.get("seed", 0))},
        settings.device,
    )
    roofline = prepared.engine.roofline
    meta["peaks"] = peaks_record(roofline.peaks) if roofline else None
    writer.json("meta.json", meta)
    profiler = StepProfiler(
        enabled=bool(cfg.profile.enabled),
        first_step=int(cfg.profile.first_step),
        num_steps=int(cfg.profile.num_steps),
        out_dir=run_dir,
    )
    sampler = TelemetrySampler(
        run_dir / "telemetry.csv", float(cfg.telemetry.period_s), clock, settings.device
    )
    start = time.perf_counter()
    sampler.start()
    error: str | None = None
    try:
        replay(prepared.engine, prepared.workload, clock, writer, [profiler], progress)
    except Exception as exc:  # the records so far are kept; the summary says what happened
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        telemetry = sampler.stop()
        profiler.close()
        writer.close()
        summary = summary_for(run_dir, cfg, prepared.workload, telemetry, error, meta["peaks"])
        writer.json("summary.json", summary)
        write_report(run_dir)
    return summary


def write_report(run_dir: Path) -> None:
    """The run's report.html; a report that cannot be drawn never fails the run."""
    try:
        build_run_report(run_dir)
    except Exception as exc:  # noqa: BLE001  (the measurements are already safe on disk)
        logging.getLogger(__name__).warning("report.html not written: %s", exc)


def peaks_record(peaks: Peaks) -> dict:
    return {
        "matmul_flops_per_s": peaks.matmul_flops_per_s,
        "copy_bytes_per_s": peaks.copy_bytes_per_s,
        "device": peaks.device,
        "dtype": peaks.dtype,
    }


def summary_for(
    run_dir: Path,
    cfg: DictConfig,
    workload: Workload,
    telemetry: TelemetryResult,
    error: str | None,
    peaks: dict | None,
) -> dict:
    requests = read_jsonl(run_dir / "requests.jsonl")
    steps = read_jsonl(run_dir / "steps.jsonl")
    summary = {
        "schema": SCHEMA_VERSION,
        "strategy": OmegaConf.to_container(cfg.strategy, resolve=True),
        "workload": workload.name,
        "workload_hash": workload.hash,
        "model": str(cfg.model.get("name")),
        "config_hash": config_hash(cfg),
        "status": "failed" if error else "complete",
        "error": error,
    }
    summary.update(summarize(requests, steps, slo_of(cfg)))
    summary["mfu_mean"], summary["mbu_mean"] = run_utilisation(steps, peaks)
    summary["telemetry"] = {
        "source": telemetry.source,
        "samples": telemetry.samples,
        "note": telemetry.note,
    }
    summary["energy_j"] = telemetry.energy_j
    tokens = summary["output_tokens"]
    summary["j_per_token"] = telemetry.energy_j / tokens if telemetry.energy_j and tokens else None
    return summary
