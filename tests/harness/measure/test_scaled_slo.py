"""The SLO a search scales from one request at a time (`harness.measure.slo.scaled`): the TTFT
line in prompt length, the limits it gives, and the line that says them."""

from __future__ import annotations

import pytest

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.measure.slo.scaled import (
    PromptLine,
    SpeedDrift,
    limits_line,
    prompt_line,
    scaled_keys,
    scaled_limits,
    speed_drift,
)


def _served(prompt: int, ttft: float) -> RequestRecord:
    """A request served alone from t=0: its first token at `ttft`, its second 0.03 s later."""
    return RequestRecord(
        id=str(prompt), prompt_len=prompt, output_len=2, t_scheduled=0.0, t_send=0.0,
        t_done=ttft + 0.03, token_times=[ttft, ttft + 0.03], output_ids=[5, 6],
        finish_reason="length",
    )  # fmt: skip


def test_the_line_through_prefill_times_is_least_squares_with_neither_part_negative() -> None:
    exact = prompt_line([(10, 0.03), (110, 0.13), (210, 0.23)])
    assert exact.fixed_s == pytest.approx(0.02) and exact.per_token_s == pytest.approx(0.001)
    assert exact.at(256) == pytest.approx(0.276)
    assert prompt_line([(16, 0.05), (16, 0.07), (16, 0.06)]) == PromptLine(0.06, 0.0)
    assert prompt_line([(10, 0.09), (100, 0.05), (200, 0.04)]) == PromptLine(0.05, 0.0)
    through_origin = prompt_line([(10, 0.001), (20, 0.1), (30, 0.2)])  # intercept below 0
    assert through_origin.fixed_s == 0.0
    assert through_origin.per_token_s == pytest.approx((0.01 + 2.0 + 6.0) / (100 + 400 + 900))


def test_scaled_ttft_is_the_multiple_of_each_prompt_s_own_prefill() -> None:
    """8 x (0.02 s + 0.001 s per token): a 16-token prompt may take 0.288 s, a 256-token one
    2.208 s, where 8 x the median TTFT (0.13 s) would allow both 1.04 s; the normalized
    latency stays 2 x its median."""
    requests = [_served(10, 0.03), _served(110, 0.13), _served(210, 0.23)]
    summary = {"ttft": {"p50": 0.13}, "normalized_latency": {"p50": 0.05}}
    limits = scaled_limits({"ttft_s": 8, "normalized_latency_s": 2}, summary, requests)
    assert limits == pytest.approx(
        {"ttft_s": 0.16, "ttft_per_prompt_token_s": 0.008, "normalized_latency_s": 0.1}
    )
    slo = SLO.from_config(limits)
    assert slo.ttft_limit(16) == pytest.approx(0.288)
    assert slo.ttft_limit(256) == pytest.approx(2.208)
    assert limits_line("fastertransformer", {"ttft_s": 8, "normalized_latency_s": 2}, limits) == (
        "SLO scaled from fastertransformer's requests one at a time (TTFT: a line in prompt "
        "length; the rest: medians): ttft = 8 x (0.02 s + 0.001 s per prompt token) = 0.16 s "
        "+ 0.008 s per prompt token; normalized_latency_s = 2 x 0.05 = 0.1 (the same limits "
        "for every strategy)"
    )


def test_a_line_through_the_origin_limits_ttft_per_prompt_token_alone() -> None:
    """TTFT with no fixed part (the line's intercept fitted below 0, as a search's reference
    floor run found on 2026-12-06): no `slo.ttft_s`, which must be positive, but the per-token
    part, so the SLO holds and a prompt of n tokens may take n times it."""
    requests = [_served(10, 0.001), _served(20, 0.1), _served(30, 0.2)]
    limits = scaled_limits({"ttft_s": 8}, {}, requests)
    assert set(limits) == {"ttft_per_prompt_token_s"}
    slo = SLO.from_config(limits)
    assert slo.ttft_limit(100) == pytest.approx(100 * limits["ttft_per_prompt_token_s"])
    assert "= 0 s + " in limits_line("fastertransformer", {"ttft_s": 8}, limits)


def test_one_prompt_length_scales_the_median_alone() -> None:
    requests = [_served(8, 0.05), _served(8, 0.07), _served(8, 0.06)]
    limits = scaled_limits({"ttft_s": 4}, {}, requests)
    assert limits == pytest.approx({"ttft_s": 0.24})
    assert limits_line("vllm", {"ttft_s": 4}, limits).endswith(
        "medians): ttft_s = 4 x 0.06 = 0.24 (the same limits for every strategy)"
    )


def test_scaling_ttft_replaces_its_per_token_part_too() -> None:
    assert scaled_keys({"ttft_s": 8, "tpot_s": 2}) == {
        "ttft_s",
        "ttft_per_prompt_token_s",
        "tpot_s",
    }
    assert scaled_keys({"normalized_latency_s": 2}) == {"normalized_latency_s"}


def test_a_scaled_limit_the_reference_did_not_measure_is_refused() -> None:
    with pytest.raises(ConfigError, match="search.slo_scale.ttft_s: the reference floor run"):
        scaled_limits({"ttft_s": 8}, {}, [])
    with pytest.raises(ConfigError, match="search.slo_scale.tpot_s: the reference floor run"):
        scaled_limits({"tpot_s": 2}, {"tpot": {"p50": None}}, [])


def test_the_machine_s_speed_drift_is_the_reference_floor_s_tpot_before_and_after() -> None:
    """The drifted search of 2026-12-02: 21.5 ms a decode step when the SLO was scaled, 29.7 ms
    by the end."""
    drift = speed_drift({"tpot": {"p50": 0.0215}}, {"tpot": {"p50": 0.0297}})
    assert drift == SpeedDrift(0.0215, 0.0297) and drift.too_large
    assert drift.line() == (
        "machine speed: one request at a time, median TPOT 21.5 ms before the first probe, "
        "29.7 ms after the last (+38.1%); each fitted knee's interval widened x1.38 for it; "
        "over 10%: the probes ran at other speeds of this machine than the reference floor "
        "measured, and the knees carry the difference; search again when it is quiet"
    )
    steady = SpeedDrift(0.0250, 0.0245)
    assert not steady.too_large and steady.line().endswith(
        "24.5 ms after the last (-2.0%); each fitted knee's interval widened x1.02 for it"
    )
    assert steady.factor == pytest.approx(0.025 / 0.0245)
    assert steady.to_json() == {
        "before_s": 0.025,
        "after_s": 0.0245,
        "change": pytest.approx(-0.02),
    }
    assert speed_drift({"tpot": {"p50": None}}, {"tpot": {"p50": 0.03}}) is None
    assert speed_drift({}, {"tpot": {"p50": 0.03}}) is None
