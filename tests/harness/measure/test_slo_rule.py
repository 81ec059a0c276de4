"""One SLO rule: a run's summary and the sweep report judge the same runs the same way, and
the attainment `servelab search` reads from a summary is the one its records give."""

from __future__ import annotations

from pathlib import Path

import pytest
from reports_rundirs import RunSpec, write_run

from servelab.base.errors import ConfigError
from servelab.harness.measure.metrics import request_latency
from servelab.harness.measure.slo.limits import SLO, RequestLatency
from servelab.reports.derive import slo_attainment
from servelab.reports.grouping import group_runs
from servelab.reports.load import load_run
from servelab.reports.sustain import group_slo


def test_search_and_sweep_report_agree_on_every_run(tmp_path: Path) -> None:
    slo = {"ttft_s": 0.5, "tpot_s": 0.05, "normalized_latency_s": 0.2}
    cases = {"fast": (0.1, 0.01, 0), "slow-ttft": (0.4, 0.01, 0), "failing": (0.1, 0.01, 2)}
    for name, (ttft, tpot, failed) in cases.items():
        write_run(tmp_path, RunSpec(name=name, slo=slo, ttft=ttft, tpot=tpot, failed=failed))
        write_run(tmp_path / "no-summary", RunSpec(name=name, slo=slo, ttft=ttft, tpot=tpot,
                                                   failed=failed, summary=False))  # fmt: skip
    verdicts = {}
    for name in cases:
        summarized = load_run(tmp_path / name)
        bare = load_run(tmp_path / "no-summary" / name)
        (group,) = group_runs([bare])
        rule = group_slo(group)
        assert rule is not None
        from_records = rule.sustains(slo_attainment(bare.request_records, rule))
        assert summarized.summary["sustained"] is from_records, name
        records = [r for r in bare.request_records if not r.excluded]
        share = SLO.from_config(slo).attained([request_latency(r) for r in records])
        assert summarized.summary["slo_attainment"] == share, name
        verdicts[name] = from_records
    assert verdicts == {"fast": True, "slow-ttft": False, "failing": False}


def test_failed_requests_count_as_misses_and_one_token_has_no_tpot() -> None:
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    one_token = RequestLatency(ttft=0.5, e2e=0.5, tpot=None, normalized_latency=0.5,
                               output_tokens=1, prompt_tokens=8)  # fmt: skip
    assert slo.meets(one_token)
    assert slo.attained([one_token, None]) == 0.5
    assert slo.sustains(0.9) and not slo.sustains(0.89)
    assert SLO().sustains(1.0) is None


def test_a_ttft_limit_that_grows_with_the_prompt_judges_each_request_by_its_own() -> None:
    """TTFT <= 0.2 s + 0.01 s per prompt token: 1 s is a miss for a 40-token prompt (0.6 s
    allowed) and within the limit for a 100-token one (1.2 s); alone, the per-token part is
    the whole limit."""

    def latency(ttft: float, prompt: int) -> RequestLatency:
        return RequestLatency(ttft=ttft, e2e=2.0, tpot=0.1, normalized_latency=0.2,
                              output_tokens=10, prompt_tokens=prompt)  # fmt: skip

    slo = SLO.from_config({"ttft_s": 0.2, "ttft_per_prompt_token_s": 0.01, "tpot_s": 0.5})
    assert slo.ttft_limit(40) == pytest.approx(0.6) and slo.ttft_limit(100) == pytest.approx(1.2)
    assert not slo.meets(latency(1.0, 40)) and slo.meets(latency(1.0, 100))
    assert slo.describe().startswith(
        "A request meets the SLO when TTFT ≤ 0.2 s + 0.01 s per prompt token, TPOT ≤ 0.5 s "
    )
    alone = SLO(ttft_per_prompt_token_s=0.01)
    assert alone.configured and alone.ttft_limit(50) == 0.5
    assert "when TTFT ≤ 0.01 s per prompt token (latencies" in alone.describe()
    assert SLO(ttft_s=0.3).ttft_limit(1000) == 0.3
    with pytest.raises(ConfigError, match="slo.ttft_per_prompt_token_s"):
        SLO.from_config({"ttft_per_prompt_token_s": -1})


@pytest.mark.parametrize(
    ("ttft", "tpot", "e2e", "tokens", "ratio"),
    [
        (0.25, 0.05, 1.0, 10, 0.5),  # every metric at half its limit
        (0.5, 0.02, 0.7, 10, 1.0),  # exactly at the TTFT limit: met
        (0.1, 0.15, 1.5, 10, 1.5),  # TPOT decides
        (0.1, None, 0.1, 1, 0.5),  # one token: no TPOT; normalized 0.1 / 0.2
        (0.5000001, 0.02, 0.7, 10, 1.0000002),  # a hair over the TTFT limit: missed
    ],
)
def test_the_ratio_is_the_largest_metric_over_its_limit_and_decides_meeting(
    ttft: float, tpot: float | None, e2e: float, tokens: int, ratio: float
) -> None:
    slo = SLO(ttft_s=0.5, tpot_s=0.1, normalized_latency_s=0.2)
    measured = RequestLatency(ttft=ttft, e2e=e2e, tpot=tpot, normalized_latency=e2e / tokens,
                              output_tokens=tokens, prompt_tokens=16)  # fmt: skip
    assert slo.ratio(measured) == pytest.approx(ratio, rel=1e-9)
    assert slo.meets(measured) is (slo.ratio(measured) <= 1) is (ratio <= 1)
    assert slo.ratio(None) == float("inf") and not slo.meets(None)
    growing = SLO(ttft_s=0.1, ttft_per_prompt_token_s=0.01)  # 0.26 s allowed for 16 tokens
    assert growing.ratio(measured) == pytest.approx(ttft / 0.26)
