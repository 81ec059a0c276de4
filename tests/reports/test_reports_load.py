"""Reading run directories and deriving per-request metrics, on synthetic runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from reports_rundirs import RunSpec, requests_of, summary_of, write_run

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.measure.slo.limits import SLO
from servelab.reports.derive import (
    request_metrics,
    slo_attainment,
    stats,
    step_metrics,
    summary_from_records,
)
from servelab.reports.load import find_run_dirs, load_run, records_frame


def test_complete_run_loads_every_file(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, RunSpec(num_requests=6)))
    assert run.complete
    assert run.problems == []
    assert run.strategy_name == "vllm"
    assert run.workload_name == "chat"
    assert run.model_name == "smollm2-135m"
    assert run.arrival == {"process": "poisson", "rate": 2.0, "concurrency": None}
    assert run.slo == {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None}
    assert len(run.requests) == 6
    assert list(run.telemetry.columns) == ["t", "cpu_pct", "rss_mib", "power_w", "energy_j"]
    assert run.meta["peaks"]["matmul_flops_per_s"] == 2.0e11
    assert run.summary is not None and run.summary["completed"] == 6


def test_crashed_run_loads_what_is_there(tmp_path: Path) -> None:
    spec = RunSpec(name="crashed", summary=False, truncated_tail=True, telemetry=False)
    run = load_run(write_run(tmp_path, spec))
    assert not run.complete
    assert run.summary is None
    assert len(run.requests) == spec.num_requests
    assert run.telemetry.empty
    assert any("skipped 1 unreadable line" in p for p in run.problems)
    assert any("did not finish" in p for p in run.problems)


def test_find_run_dirs_is_recursive_and_includes_crashed_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "sweep" / "0", RunSpec(name="a"))
    b = write_run(tmp_path / "sweep" / "1", RunSpec(name="b", summary=False))
    (tmp_path / "sweep" / "notes").mkdir()
    assert find_run_dirs([tmp_path / "sweep"]) == [a.resolve(), b.resolve()]
    assert find_run_dirs([a, a / "summary.json"]) == [a.resolve()]


def test_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="paths: .*does not exist"):
        find_run_dirs([tmp_path / "nope"])
    with pytest.raises(ConfigError, match="run_dir"):
        load_run(tmp_path)


def _record(**fields) -> RequestRecord:
    times = fields.get("token_times", [])
    base = dict(prompt_len=4, output_len=len(times), output_ids=[0] * len(times))
    return RequestRecord(**(base | fields))


def test_request_metrics_follow_the_definitions() -> None:
    records = [
        _record(id="0", t_scheduled=0.0, t_send=0.5, t_done=3.0, token_times=[1.0, 1.5, 2.5],
                finish_reason="stop", preemptions=2),
        _record(id="1", t_scheduled=1.0, t_send=1.0, token_times=[1.25], finish_reason="length"),
        _record(id="2", t_scheduled=1.0, t_send=1.0, token_times=[], finish_reason="error"),
        _record(id="3", t_scheduled=0.0, t_send=0.0, token_times=[0.1], finish_reason="stop",
                excluded=True),
    ]  # fmt: skip
    m = request_metrics(records)
    assert m["ok"].tolist() == [True, True, False, False]
    assert m["excluded"].tolist() == [False, False, False, True]
    # from arrival (0.0), not from t_send (0.5); E2E to delivery (3.0), not the last token
    assert m.loc[0, ["ttft", "e2e", "tpot", "normalized_latency"]].tolist() == [
        1.0, 3.0, 0.75, 1.0,
    ]  # fmt: skip
    assert m.loc[1, "ttft"] == 0.25 and math.isnan(m.loc[1, "tpot"])
    assert m["preemptions"].tolist() == [2, 0, 0, 0]
    # failed request 2 counts against attainment, excluded request 3 does not count at all
    assert slo_attainment(records, SLO(ttft_s=0.3)) == pytest.approx(1 / 3)
    assert slo_attainment(records, SLO(ttft_s=1.0, tpot_s=0.5)) == pytest.approx(1 / 3)
    assert slo_attainment(records, SLO(ttft_s=1.0, tpot_s=1.0)) == pytest.approx(2 / 3)


def test_stats_use_linear_percentiles() -> None:
    result = stats(np.array([1.0, 2.0, 3.0, 4.0, math.nan]))
    assert result == {
        "mean": 2.5, "std": pytest.approx(1.118033988749895), "p50": 2.5,
        "p90": pytest.approx(3.7), "p95": pytest.approx(3.85), "p99": pytest.approx(3.97),
    }  # fmt: skip
    assert all(math.isnan(v) for v in stats(np.array([])).values())


def test_summary_from_records_matches_an_independent_summary() -> None:
    spec = RunSpec(num_requests=9, failed=2, excluded=1, ttft=0.2, tpot=0.04)
    records = requests_of(spec)
    expected = summary_of(spec, records)
    got = summary_from_records(
        [RequestRecord.from_json(r) for r in records], [], SLO.from_config(spec.slo)
    )
    for key in ("completed", "failed"):
        assert got[key] == expected[key]
    for key in ("duration_s", "request_throughput", "output_throughput", "goodput"):
        assert got[key] == pytest.approx(expected[key])
    for metric in ("ttft", "tpot", "itl", "e2e", "normalized_latency"):
        assert got[metric] == pytest.approx(expected[metric])


def test_step_metrics_derive_duration_tokens_and_waste() -> None:
    steps = pd.DataFrame(
        [
            {"t_start": 0.0, "t_end": 0.1, "model_s": 0.08, "prefill_tokens": 5,
             "decode_tokens": 2, "kv_allocated_slots": 10, "kv_live_slots": 6},
            {"t_start": 0.1, "t_end": 0.3, "model_s": None, "prefill_tokens": 0,
             "decode_tokens": 3, "kv_allocated_slots": 0, "kv_live_slots": 0},
        ]
    )  # fmt: skip
    frame = step_metrics(steps)
    assert frame["duration"].tolist() == pytest.approx([0.08, 0.2])
    assert frame["tokens"].tolist() == [7, 3]
    assert frame.loc[0, "kv_waste"] == pytest.approx(0.4)
    assert math.isnan(frame.loc[1, "kv_waste"])


def test_summary_strategy_may_be_a_mapping(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, RunSpec())
    (run_dir / "config.yaml").unlink()
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["strategy"] = {"name": "orca"}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    run = load_run(run_dir)
    assert run.strategy_name == "orca"
    assert run.workload_name == "chat"
    assert "no config.yaml" in run.problems


def test_a_records_table_is_the_table_of_their_json_lines() -> None:
    """Built a column at a time, the table equals pandas' own from the records' JSON lines:
    counters in the order first met, missing ones empty, lists (even of unequal lengths)
    kept as objects, and no records make an empty table."""
    base = (0.0, 0.01, 0.01, 1, 1, 0, 0, 1, 16, 16, 64, 0.0, 0)
    steps = [
        StepRecord(0, *base, counters={"spec_proposed": 2, "spec_accepted_counts": [1, 1]}),
        StepRecord(1, *base),
        StepRecord(2, *base, counters={"kv_blocks_used": 3, "spec_accepted_counts": [0]}),
        StepRecord(3, *base, counters={"spec_proposed": 4, "spec_accepted_counts": [2, 0, 1]}),
    ]
    expected = pd.DataFrame.from_records([s.to_json() for s in steps])
    table = records_frame(steps)
    pd.testing.assert_frame_equal(table, expected)
    assert list(table.columns[-3:]) == ["spec_proposed", "spec_accepted_counts", "kv_blocks_used"]
    assert table["spec_proposed"].isna().tolist() == [False, True, True, False]
    requests = [RequestRecord.from_json(line) for line in requests_of(RunSpec())]
    pd.testing.assert_frame_equal(
        records_frame(requests), pd.DataFrame.from_records([r.to_json() for r in requests])
    )
    assert records_frame([]).empty
