"""Rebuild a run's `summary.json` and `report.html` from its records alone.

A run killed before it wrote its summary (SIGKILL, power loss, an out-of-memory kill) leaves
`config.yaml`, `meta.json`, `requests.jsonl`, `steps.jsonl` and `telemetry.csv`, every line
whole up to the kill. This recomputes the summary from them with the same code a finished
run uses, marks it `incomplete` (flagged, so gates refuse it and a sweep restarted later
redoes it), and says how many of the planned requests were never recorded. A run that did
write its summary keeps its status and error; its figures are recomputed.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.measure.flags import INCOMPLETE, Flag, add_flags
from servelab.harness.measure.rundir import RunRecords, torn_tail, write_json_atomic
from servelab.harness.measure.telemetry import TelemetryResult
from servelab.harness.runs.run import summary_for
from servelab.harness.runner.spec import run_record

STOPPED = "the run stopped before writing its summary; rebuilt from its records"


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
    meta = _read_json(run_dir / "meta.json") or {}
    earlier = _read_json(run_dir / "summary.json")
    workload = (
        str(meta.get("workload_name") or cfg.workload.get("name")),
        str(meta.get("workload_hash")),
        meta.get("workload_requests"),
    )
    strategy = meta.get("strategy")
    if record.backend == "inprocess":
        strategy = record.strategy
    error = earlier.get("error") if earlier else STOPPED
    records = RunRecords.read(run_dir)
    summary = summary_for(
        run_dir,
        records,
        record,
        workload,
        _telemetry(run_dir),
        error,
        meta.get("peaks"),
        strategy or {},
    )
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


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return loaded if isinstance(loaded, dict) else None


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
