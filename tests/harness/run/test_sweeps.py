"""Sweeps: a rerun skips complete runs and redoes failed or incomplete ones (a run killed
mid-way, summarized from its records); the submitit launcher runs jobs."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.harness.run.summary import summarize_run

BASE = [
    "model=dummy-tiny",
    "telemetry.roofline=false",
    "workload.num_requests=3",
    "workload.output_len.value=4",
    "engine.dtype=fp32",
]


def _sweep(sweep_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "servelab",
        "-m",
        *BASE,
        f"hydra.sweep.dir={sweep_dir}",
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.integration
def test_a_rerun_sweep_redoes_only_what_did_not_finish(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir, "strategy=fastertransformer,orca")
    assert first.returncode == 0, first.stderr[-2000:]
    runs = sorted(p for p in sweep_dir.iterdir() if (p / "summary.json").exists())
    assert [p.name for p in runs] == ["0-fastertransformer-smoke", "1-orca-smoke"]
    done, killed = runs
    kept = (done / "requests.jsonl").stat().st_mtime_ns
    # a run killed halfway leaves records but no summary; summarize marks it incomplete
    (killed / "summary.json").unlink()
    summarize_run(killed)
    assert json.loads((killed / "summary.json").read_text())["status"] == "incomplete"
    second = _sweep(sweep_dir, "strategy=fastertransformer,orca")
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"already complete, not run again: {done}" in second.stdout
    assert (done / "requests.jsonl").stat().st_mtime_ns == kept
    assert json.loads((killed / "summary.json").read_text())["status"] == "complete"
    assert (sweep_dir / "report.html").exists()
    rows = list(csv.DictReader((sweep_dir / "summary.csv").open()))
    # the correctness column compares each run's tokens with the baseline run's
    assert [(r["strategy"], r["identical_share"]) for r in rows] == [
        ("fastertransformer", "1.0"),
        ("orca", "1.0"),
    ]


@pytest.mark.integration
def test_submitit_local_launcher_runs_each_job(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    result = _sweep(sweep_dir, "hydra/launcher=local_processes", "strategy=fastertransformer,orca")
    assert result.returncode == 0, result.stderr[-2000:]
    summaries = sorted(sweep_dir.glob("*/summary.json"))
    assert len(summaries) == 2
    assert all(json.loads(p.read_text())["completed"] == 3 for p in summaries)
    assert os.path.isdir(sweep_dir / ".submitit")
