"""A whole run on the tiny model: the run directory is complete and its summary recomputable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.engine.engine import Engine
from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.rundir import read_requests, read_steps
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run

OVERRIDES = ["model=dummy-tiny", "telemetry.roofline=false", "engine.dtype=fp32"]


@pytest.mark.integration
def test_summary_is_recomputable_from_the_records(tmp_path: Path) -> None:
    cfg = compose([*OVERRIDES, "strategy=orca", "slo.ttft_s=0.5"])
    summary = run(cfg, tmp_path, progress=False)
    for name in ("config.yaml", "meta.json", "requests.jsonl", "steps.jsonl", "telemetry.csv"):
        assert (tmp_path / name).exists(), name
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    requests = read_requests(tmp_path)
    recomputed = summarize(requests, read_steps(tmp_path), SLO.of_config(cfg))
    for key, value in recomputed.items():
        assert on_disk[key] == pytest.approx(value), key
    assert on_disk["schema"] == 2 and on_disk["status"] == "complete"
    assert on_disk["completed"] == 8 and len(requests) == 8
    assert all(len(r.token_times) == r.output_len == 16 for r in requests)
    assert all(r.t_done == r.token_times[-1] for r in requests)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["workload_hash"] == on_disk["workload_hash"]


@pytest.mark.integration
def test_a_crash_mid_run_keeps_the_records_and_marks_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = Engine.step

    def failing_step(self: Engine):
        if self.step_index == 5:
            raise RuntimeError("device lost")
        return real_step(self)

    monkeypatch.setattr(Engine, "step", failing_step)
    with pytest.raises(RuntimeError, match="device lost"):
        run(compose([*OVERRIDES, "strategy=orca"]), tmp_path, progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "device lost" in summary["error"]
    assert len(read_steps(tmp_path)) == 5
    assert summary["steps"] == 5
    # every request in flight is written as failed, with the error (before: none was written)
    requests = read_requests(tmp_path)
    assert len(requests) == 8 and summary["failed"] == 8
    assert {r.finish_reason for r in requests} == {"error"}
    assert all("RuntimeError: device lost" in r.error for r in requests)
