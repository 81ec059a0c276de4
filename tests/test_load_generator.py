"""The load generator checked on every endpoint run (`harness/measure/load_generator.py`):
rates, send lag, the late share and the fit of the sent gaps to the configured process; and a
client driven far past what it can send is flagged, and a gate refuses the run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from scripts.client_bench import at_rate
from servelab.harness.measure.flags import ARRIVALS_OFF, SEND_LAG, refusals
from servelab.harness.measure.load_generator import gaps_fit, kolmogorov_p, load_generator
from servelab.harness.records import RequestRecord
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
    assert ARRIVALS_OFF in flooded["flag_codes"]  # its sends came as fast as it could, not Poisson
    assert ARRIVALS_OFF not in summary["flag_codes"]
    rows = dict(load_generator_rows(section))  # the run report's table of it
    assert rows["configured rate (req/s)"] == 40.0 and rows["requests sent"] == 40
    assert rows["send lag p99 (ms)"] == pytest.approx(1000 * section["lag_p99_s"])
    assert rows["gaps against the configured process: KS p-value"] == section["ks_p_value"]
