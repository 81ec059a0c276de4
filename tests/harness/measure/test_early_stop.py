"""Ending a run once its SLO verdict can only be a failure (`slo.stop_early`).

The rule on hand-made requests (which requests have certainly missed, and how many misses
make the verdict certain), then a real run far over saturation: it stops, every planned
request is recorded, and the run served to its end gets the same verdict.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.engine.request import Request, SamplingParams
from servelab.harness.measure.rundir import read_requests
from servelab.harness.measure.slo.early_stop import EarlyStop, wilson
from servelab.harness.measure.slo.limits import SLO

ARRIVAL = 10.0


def _sent(max_tokens: int = 5, excluded: bool = False, name: str = "r") -> Request:
    request = Request(name, [1, 2, 3], SamplingParams(max_tokens=max_tokens), ARRIVAL)
    request.t_send = ARRIVAL
    request.excluded = excluded
    return request


@pytest.mark.parametrize(
    ("limit", "first_token_at", "missed_after"),
    [
        ("ttft_s", None, 1.0),  # no first token yet, 1 s after arrival
        ("e2e_s", ARRIVAL + 0.1, 1.0),  # not delivered, 1 s after arrival
        ("normalized_latency_s", ARRIVAL + 0.1, 5.0),  # 1 s a token over its 5 tokens at most
        ("tpot_s", ARRIVAL + 0.1, 0.1 + 4.0),  # 1 s a gap over its 4 gaps at most
    ],
)
def test_a_request_in_flight_past_a_limit_has_certainly_missed(
    limit: str, first_token_at: float | None, missed_after: float
) -> None:
    """One counted request (a single miss fails a target of 0.9 at 95%): the stop comes just
    after the limit is certainly past, not just before."""
    request = _sent()
    if first_token_at is not None:
        request.token_times.append(first_token_at)
    stop = EarlyStop(SLO(**{limit: 1.0}), 0.95, [request])
    assert stop.check(ARRIVAL + missed_after - 0.01) is None
    stopped = stop.check(ARRIVAL + missed_after + 0.01)
    assert stopped is not None and (stopped.counted, stopped.missed) == (1, 1)


def test_a_ttft_limit_that_grows_with_the_prompt_is_each_request_s_own() -> None:
    """0.5 s + 0.1 s per prompt token: the 3-token prompt's limit is 0.8 s."""
    request = _sent()
    stop = EarlyStop(SLO(ttft_s=0.5, ttft_per_prompt_token_s=0.1), 0.95, [request])
    assert stop.check(ARRIVAL + 0.79) is None
    stopped = stop.check(ARRIVAL + 0.81)
    assert stopped is not None and stopped.missed == 1


def test_a_request_not_yet_sent_or_left_out_is_never_a_miss() -> None:
    """Counted: three sent, past the TTFT limit, and one not yet sent; the one left out (warm-up)
    is not counted. Three certain misses of four."""
    unsent = _sent()
    unsent.t_send = None
    sent = [_sent(name=f"s{i}") for i in range(3)]
    stop = EarlyStop(SLO(ttft_s=1.0), 0.95, [unsent, _sent(excluded=True), *sent])
    stopped = stop.check(ARRIVAL + 100)
    assert stopped is not None and (stopped.counted, stopped.missed) == (4, 3)


def test_it_stops_at_the_first_count_of_misses_that_makes_failure_certain() -> None:
    """20 counted requests, target 0.9 at 95%: 16 met of 20 could still be read as the knee
    (the Wilson interval reaches 0.9), 15 of 20 cannot."""
    requests = [_sent(name=f"r{i}") for i in range(20)]
    stop = EarlyStop(SLO(ttft_s=1.0, attainment=0.9), 0.95, requests)
    for done in requests[:4]:
        done.close("error", ARRIVAL + 0.5, "failed")  # delivered and missed
    assert stop.check(ARRIVAL + 0.6) is None
    assert wilson(16, 20, 0.95)[1] >= 0.9  # 16 of 20 could still reach the target
    requests[4].close("error", ARRIVAL + 0.7, "failed")
    stopped = stop.check(ARRIVAL + 0.8)
    assert stopped is not None
    assert (stopped.counted, stopped.missed, stopped.delivered) == (20, 5, 5)
    assert stopped.best_attainment == 0.75 and stopped.best_high < 0.9
    assert wilson(15, 20, 0.95)[1] < 0.9


def test_a_delivered_request_that_met_the_slo_is_no_miss() -> None:
    request = _sent(max_tokens=2)
    request.output_ids = [7, 8]
    request.token_times = [ARRIVAL + 0.2, ARRIVAL + 0.3]
    request.finish("length")
    request.deliver(ARRIVAL + 0.3)
    assert EarlyStop(SLO(ttft_s=1.0), 0.95, [request]).check(ARRIVAL + 50) is None


@pytest.mark.parametrize("value", [0, 1, 1.5, True, "yes"])
def test_stop_early_must_be_a_confidence(value: object) -> None:
    with pytest.raises(ConfigError, match=r"slo\.stop_early"):
        SLO.from_config({"ttft_s": 1.0, "stop_early": value})


@pytest.mark.integration
def test_a_run_over_saturation_stops_with_the_verdict_the_whole_run_gets(tmp_path: Path) -> None:
    """The tiny model with every step slowed, at ten times the rate it serves: the run with
    `slo.stop_early` ends once failure is certain, records every planned request (those not
    delivered as `stopped`), and the same run served to its end fails too, with no more
    requests meeting the SLO than the stopped run's best case allowed."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run

    def summary(*extra: str) -> dict:
        overrides = [
            "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false",
            "workload=random", "workload.num_requests=24", "workload.input_len.dist=fixed",
            "workload.input_len.value=8", "workload.output_len.value=6",
            "workload.arrival.process=poisson", "workload.arrival.rate=40",
            "engine.max_batch_size=2", "+engine.test_step_delay_s=0.02", "slo.ttft_s=0.2",
            *extra,
        ]  # fmt: skip
        return run(compose(overrides), tmp_path / str(len(extra)), progress=False)

    stopped = summary("slo.stop_early=0.95")
    assert stopped["status"] == "stopped", stopped.get("error")
    evidence = stopped["stopped_early"]
    assert evidence["counted"] == 24 and evidence["best_high"] < 0.9
    assert evidence["delivered"] < 24 and stopped["not_recorded"] == 0
    reasons = [r.finish_reason for r in read_requests(tmp_path / "1")]
    assert len(reasons) == 24 and reasons.count("stopped") == 24 - evidence["delivered"]
    assert wilson(24 - evidence["missed"], 24, 0.95)[1] < 0.9

    whole = summary()
    assert whole["status"] == "complete"
    met = round(whole["slo_attainment"] * 24)
    assert met <= 24 - evidence["missed"]
    assert wilson(met, 24, 0.95)[1] < 0.9


@pytest.mark.integration
def test_an_endpoint_run_stops_early_as_an_in_process_one_does(tmp_path: Path) -> None:
    """Against the fake server with a TTFT limit no response can meet: the run ends once
    failure is certain, every planned request recorded (those not delivered as `stopped`);
    with worker processes the same setting is refused before any request is sent."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.serving.process import start_fake_server

    server = start_fake_server(tokens=3)
    overrides = [
        "backend=openai", f"endpoint.url={server.url}", "model=dummy-tiny", "workload=random",
        "workload.num_requests=200", "workload.input_len.dist=fixed",
        "workload.input_len.value=8", "workload.output_len.value=3",
        "workload.arrival.process=poisson", "workload.arrival.rate=100",
        "telemetry.roofline=false", "slo.ttft_s=0.000001", "slo.stop_early=0.95",
    ]  # fmt: skip
    try:
        stopped = run(compose(overrides), tmp_path / "stopped", progress=False)
        with pytest.raises(ConfigError, match=r"slo\.stop_early"):
            run(compose([*overrides, "endpoint.workers=2"]), tmp_path / "workers", progress=False)
    finally:
        server.stop()
    assert stopped["status"] == "stopped", stopped.get("error")
    evidence = stopped["stopped_early"]
    assert evidence["counted"] == 200 and evidence["delivered"] < 200
    reasons = [r.finish_reason for r in read_requests(tmp_path / "stopped")]
    assert len(reasons) == 200 and reasons.count("stopped") == 200 - evidence["delivered"]
