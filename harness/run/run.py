"""One run, end to end: validate, load, build the workload and engine, replay, record, summarise.

`run` reads the composed config once (`spec.run_spec`); everything below takes its typed parts.

The `backend` decides what serves the workload (`backends.registry`: servelab's engine in this
process, simulated, or a peer); every backend is measured the same way here, and its summary
built in one place (`summary`).

Every check of the input happens before the model is placed or the clock starts, so bad
input costs seconds and a clear line. Once the run starts, everything measured is written
as it happens; a failure mid-run still leaves the records, every request in flight written
as failed, and a summary marked failed.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.harness.measure.flags import add_flags
from servelab.harness.measure.meta import collect_meta
from servelab.harness.measure.rundir import RunWriter, read_json
from servelab.harness.measure.slo.early_stop import StoppedEarly, StopRecord
from servelab.harness.measure.telemetry import NoTelemetry, TelemetrySampler
from servelab.harness.run.backends.registry import prepared_backend
from servelab.harness.run.clock import RunClock
from servelab.harness.run.collector import collector_paused
from servelab.harness.run.servers.managed import running_server
from servelab.harness.run.spec import RunSpec, config_hash, run_spec
from servelab.harness.run.summary import meta_entries, summary_for


def completed_summary(cfg: DictConfig, run_dir: Path) -> dict | None:
    """The summary of an earlier complete (or stopped early: its verdict is known) run of this
    same config in `run_dir`, if any."""
    summary = read_json(run_dir / "summary.json")
    if summary is None:
        return None
    same = summary.get("config_hash") == config_hash(cfg)
    return summary if same and summary.get("status") in ("complete", "stopped") else None


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
    backend = prepared_backend(spec, clock, progress)
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
            records = writer.written()
            summary = summary_for(run_dir, records, record, meta, telemetry, error)
            if clock.skipped:
                summary["idle_skipped"] = {"spans": len(clock.skipped), "s": clock.skipped_s}
            if stopped is not None:
                summary["status"] = "stopped"
                summary["stopped_early"] = stopped.as_dict()
            add_flags(summary, backend.flags(records))
            meta_entries(summary, meta)
            writer.json("summary.json", summary)
    return summary
