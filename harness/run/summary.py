"""A run's `summary.json`, built in one place from its records, config and `meta.json`: at the
end of the run (`summary_for`, `run.run`), and again from the run directory alone
(`summarize_run`).

A run killed before it wrote its summary (SIGKILL, power loss, an out-of-memory kill) leaves
`config.yaml`, `meta.json`, `requests.jsonl`, `steps.jsonl` and `telemetry.csv`, every line
whole up to the kill. This recomputes the summary from them with the same code a finished
run uses, marks it `incomplete` (flagged, so gates refuse it and a sweep restarted later
redoes it), and says how many of the planned requests were never recorded. A run that did
write its summary keeps its status and error; its figures are recomputed.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import (
    INCOMPLETE,
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
from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.rundir import (
    SCHEMA_VERSION,
    RunRecords,
    read_json,
    torn_tail,
    write_json_atomic,
)
from servelab.harness.measure.server_metrics import FILE as SERVER_METRICS
from servelab.harness.measure.server_metrics import server_metrics_summary
from servelab.harness.measure.telemetry import TelemetryResult
from servelab.harness.run.backends import KINDS
from servelab.harness.run.spec import RunRecord, run_record
from servelab.harness.run.step_delay import delay_flag

STOPPED = "the run stopped before writing its summary; rebuilt from its records"


def summary_for(
    run_dir: Path,
    records: RunRecords,
    record: RunRecord,
    meta: dict,
    telemetry: TelemetryResult,
    error: str | None,
) -> dict:
    """The summary of the run in `run_dir` from its records and its `meta.json` (the workload's
    name, hash and how many requests it planned; the peaks; the strategy a peer described)."""
    requests, steps = records.requests, records.steps
    name = str(meta.get("workload_name") or record.config.workload.get("name"))
    workload_hash, planned = str(meta.get("workload_hash")), meta.get("workload_requests")
    kind = KINDS[record.backend]  # checked when the config was read
    strategy = record.strategy if kind.runs_engine else meta.get("strategy") or {}
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
    summary.update(summarize(requests, steps, record.slo, meta.get("peaks")))
    summary["not_recorded"] = None if planned is None else planned - len(requests)
    summary["telemetry"] = {
        "source": telemetry.source,
        "samples": telemetry.samples,
        "note": telemetry.note,
    }
    if kind.over_http:  # a client sent the requests: was it on time?
        summary["load_generator"] = load_generator(requests, record.arrival).as_dict()
        summary["server_metrics"] = server_metrics_summary(run_dir / SERVER_METRICS)
    summary["energy_j"] = telemetry.energy_j
    tokens = summary["output_tokens"]
    summary["j_per_token"] = telemetry.energy_j / tokens if telemetry.energy_j and tokens else None
    flags = summary_flags(summary) + step_dropouts(steps)
    spans = in_flight_spans(requests)
    flags += telemetry_dropouts(run_dir / "telemetry.csv", record.telemetry_period_s, spans)
    if kind.served_here:  # a server elsewhere is one of the other processes
        flags += busy_machine(run_dir / "telemetry.csv", spans)
    delay = record.step_delay_s
    if delay > 0:
        summary["test_step_delay_s"] = delay
        flags.append(Flag(TEST_STEP_DELAY, delay_flag(delay)))
    add_flags(summary, flags)
    return summary


def meta_entries(summary: dict, meta: dict) -> None:
    """What the summary repeats from `meta.json`: the weights served, the dtype, and what a
    simulation predicted with."""
    if "weights" in meta:
        summary["weights"] = meta["weights"]
    for key in ("dtype", SIMULATED):
        if key in meta:
            summary[key] = meta[key]


def summarize_run(run_dir: Path) -> dict:
    """Write `run_dir`'s summary.json and report.html from its records; the summary."""
    config = run_dir / "config.yaml"
    if not config.is_file() or not (run_dir / "requests.jsonl").is_file():
        raise ConfigError(
            "run_dir", f"{run_dir} has no config.yaml and requests.jsonl; pass a run directory"
        )
    cfg = OmegaConf.load(config)
    assert isinstance(cfg, DictConfig)
    record = run_record(cfg)
    meta = read_json(run_dir / "meta.json") or {}
    earlier = read_json(run_dir / "summary.json")
    error = earlier.get("error") if earlier else STOPPED
    records = RunRecords.read(run_dir)
    summary = summary_for(run_dir, records, record, meta, _telemetry(run_dir), error)
    meta_entries(summary, meta)
    torn = [name for name in ("requests.jsonl", "steps.jsonl") if torn_tail(run_dir / name)]
    if earlier is None or earlier.get("status") == "incomplete":
        summary["status"] = "incomplete"
        missing = summary["not_recorded"]
        text = "incomplete: the run stopped before writing its summary"
        if missing:
            text += f" ({missing} planned requests never recorded)"
        add_flags(summary, [Flag(INCOMPLETE, text)])
    else:
        summary["status"] = earlier.get("status", summary["status"])
    if torn:
        summary["torn_lines"] = torn
    summary["rebuilt"] = True
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


def _telemetry(run_dir: Path) -> TelemetryResult:
    """What telemetry.csv holds; energy is not known without the sampler's counters."""
    path = run_dir / "telemetry.csv"
    rows = path.read_text().count("\n") - 1 if path.is_file() else 0
    return TelemetryResult(
        samples=max(rows, 0),
        energy_j=None,
        note="rebuilt from telemetry.csv after the run stopped; energy not known",
        source="telemetry.csv",
    )
