"""The load generator checked on every endpoint run (`harness/measure/load_generator.py`):
rates, send lag, the late share and the fit of the sent gaps to the configured process; a
client driven far past what it can send is flagged, and a gate refuses the run; worker
processes (`endpoint.workers`) send exactly the schedule between them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from scripts.client_bench import at_rate
from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.engine.request import Request, SamplingParams
from servelab.harness.measure.flags import ARRIVALS_OFF, SEND_LAG, refusals, summary_flags
from servelab.harness.measure.load_generator import (
    LATE_S,
    gaps_fit,
    kolmogorov_p,
    load_generator,
)
from servelab.harness.run.backends.base import peer_inputs
from servelab.harness.run.backends.endpoint_settings import endpoint_settings
from servelab.harness.run.backends.endpoint_workers import workers_for
from servelab.harness.run.compose import compose
from servelab.harness.run.settings import model_of
from servelab.harness.serving.process import start_fake_server
from servelab.reports.run_report import load_generator_rows
from servelab.workloads.arrivals import ArrivalSpec

POISSON = ArrivalSpec("poisson", rate=50.0)


def test_the_gaps_fit_the_process_that_drew_them_and_not_another() -> None:
    rng = np.random.default_rng(4)
    exponential = rng.exponential(1 / 50.0, 400)
    _, p = gaps_fit(exponential, POISSON)
    assert p is not None and p > 0.05
    _, p_even = gaps_fit(np.full(400, 1 / 50.0), POISSON)  # the same rate, no randomness
    assert p_even is not None and p_even < 1e-6
    bursty = ArrivalSpec("gamma", rate=50.0, burstiness=0.25)
    gamma = rng.gamma(0.25, 1 / (50.0 * 0.25), 400)
    assert gaps_fit(gamma, bursty)[1] > 0.05 and gaps_fit(gamma, POISSON)[1] < 1e-6
    assert gaps_fit(exponential[:5], POISSON) == (None, None)
    assert gaps_fit(exponential, ArrivalSpec("offline")) == (None, None)
    assert kolmogorov_p(0.0, 100) == 1.0 and kolmogorov_p(0.5, 100) < 1e-10


def test_the_client_s_own_timing_under_the_resolution_is_no_misfit_a_wrong_schedule_is() -> None:
    rate = ArrivalSpec("poisson", rate=1000.0)
    schedule = np.cumsum(np.random.default_rng(5).exponential(1 / 1000.0, 60_000))
    sends = schedule.copy()
    for i in range(1, sends.size):  # one process serialising its sends, 0.4 ms apart at least
        sends[i] = max(sends[i], sends[i - 1] + 0.0004)
    assert gaps_fit(np.diff(schedule), rate)[1] > 0.001
    assert gaps_fit(np.diff(sends), rate)[1] < 1e-6  # at any resolution: rejected
    assert gaps_fit(np.diff(sends), rate, resolution_s=LATE_S)[1] > 0.001
    records = [record(a, b) for a, b in zip(schedule[:20_000], sends[:20_000], strict=True)]
    codes = {
        f.code for f in summary_flags({"load_generator": load_generator(records, rate).as_dict()})
    }
    assert ARRIVALS_OFF not in codes
    even = [record(i / 50, i / 50) for i in range(400)]  # on time, but evenly, not Poisson
    codes = {
        f.code for f in summary_flags({"load_generator": load_generator(even, POISSON).as_dict()})
    }
    assert ARRIVALS_OFF in codes


def record(scheduled: float, sent: float) -> RequestRecord:
    return RequestRecord(id=str(scheduled), prompt_len=4, output_len=1, t_scheduled=scheduled,
                         token_times=[sent + 0.01], output_ids=[1], finish_reason="length",
                         t_send=sent, t_done=sent + 0.01)  # fmt: skip


def test_lag_late_share_and_achieved_rate_from_the_records() -> None:
    records = [record(i / 10, i / 10 + (0.02 if i % 4 == 0 else 0.001)) for i in range(20)]
    found = load_generator(records, ArrivalSpec("constant", rate=10.0))
    assert found.sent == 20 and found.configured_rate == 10.0
    assert found.late_share == pytest.approx(5 / 20)  # 0, 4, 8, 12, 16: 20 ms late
    assert found.lag_max_s == pytest.approx(0.02) and found.lag_p50_s == pytest.approx(0.001)
    assert found.achieved_rate == pytest.approx(19 / (1.9 + 0.001 - 0.02), rel=1e-6)
    assert found.ks_p_value is None  # constant arrivals: no distribution to test


def test_an_endpoint_run_reports_its_load_generator(tmp_path: Path) -> None:
    server = start_fake_server(tokens=3)
    try:
        at_rate(server.url, rate=40.0, seconds=1.0, tokens=3, out=tmp_path)
        overloaded = at_rate(server.url, rate=50_000.0, seconds=0.04, tokens=3, out=tmp_path)
    finally:
        server.stop()
    summary = json.loads((tmp_path / "rate-40" / "summary.json").read_text())
    section = summary["load_generator"]
    assert section["process"] == "poisson" and section["configured_rate"] == 40.0
    assert section["sent"] == 40 and section["achieved_rate"] > 0
    assert 0 <= section["late_share"] <= 1 and section["ks_p_value"] is not None
    assert overloaded.requests == 2000  # sent as fast as one client can: far behind 50,000/s
    flooded = json.loads((tmp_path / "rate-50000" / "summary.json").read_text())
    assert SEND_LAG in flooded["flag_codes"] and refusals(flooded)
    assert flooded["load_generator"]["late_share"] > 0.5
    assert ARRIVALS_OFF not in summary["flag_codes"]
    assert summary["server_metrics"] is None  # the fake server publishes no /metrics
    meta = json.loads((tmp_path / "rate-40" / "meta.json").read_text())
    assert "404" in meta["backend"]["server_metrics"]["note"]
    rows = dict(load_generator_rows(section))  # the run report's table of it
    assert rows["configured rate (req/s)"] == 40.0 and rows["requests sent"] == 40
    assert rows["send lag p99 (ms)"] == pytest.approx(1000 * section["lag_p99_s"])
    assert (
        rows["gaps over 10 ms against the configured process: KS p-value"] == section["ks_p_value"]
    )


def test_worker_processes_send_exactly_the_schedule(tmp_path: Path) -> None:
    server = start_fake_server(tokens=3)
    try:
        result = at_rate(server.url, rate=200.0, seconds=0.5, tokens=3, out=tmp_path, workers=3)
    finally:
        server.stop()
    run_dir = tmp_path / "rate-200"
    assert json.loads((run_dir / "meta.json").read_text())["backend"]["workers"] == 3
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    recorded = OmegaConf.load(run_dir / "config.yaml")
    workload = peer_inputs(model_of(recorded), recorded.workload).workload  # as it was drawn
    schedule = {spec.id: spec.arrival for spec in workload.requests}
    assert sorted(r["id"] for r in records) == sorted(schedule)  # each request once
    for record in records:  # each at its scheduled arrival, on the run's one clock
        assert record["t_scheduled"] == schedule[record["id"]]
        assert record["t_send"] >= record["t_scheduled"] and record["finish_reason"] == "length"
    assert result.requests == len(schedule) == 100


def test_a_closed_loop_or_a_bad_worker_count_is_refused_before_any_work() -> None:
    with pytest.raises(ConfigError, match="endpoint.workers: 0 must be a positive integer"):
        compose(["backend=openai", "endpoint.workers=0"])
    cfg = compose(["backend=openai"])
    cfg.endpoint.workers = 0  # a tree not composed: its reader checks it
    with pytest.raises(ConfigError, match="endpoint.workers"):
        endpoint_settings(cfg.endpoint)
    requests = [Request(str(i), [1], SamplingParams(4), t_scheduled=i / 100) for i in range(100)]
    with pytest.raises(ConfigError, match="closed loop"):
        workers_for(2, requests, closed_loop=True)
    assert workers_for("auto", requests, closed_loop=True) == 1
    assert workers_for("auto", requests, closed_loop=False) == 1  # 100 req/s: one is enough
    dense = [Request(str(i), [1], SamplingParams(4), t_scheduled=i / 3600) for i in range(3600)]
    assert workers_for("auto", dense, closed_loop=False) == min(os.cpu_count() or 1, 5)
    assert workers_for("auto", dense, closed_loop=False, stops_early=True) == 1
    burst = [Request(str(i), [1], SamplingParams(4)) for i in range(1600)]  # all at t = 0
    assert workers_for("auto", burst, closed_loop=False) == min(os.cpu_count() or 1, 2)
    assert workers_for("auto", burst[:8], closed_loop=False) == 1
