"""A knee search's report: its answer first (a sentence per pair, the faster on top), each
strategy's quantile curve, then its probes as a sweep; the simulator's runs left out."""

from __future__ import annotations

import json
from pathlib import Path

from reports_rundirs import RunSpec, page_text, write_run

from servelab.harness.search.estimator import Knee
from servelab.harness.search.result import StrategyResult
from servelab.reports.search_report import answer_lines
from servelab.reports.sweep_report import build_sweep_report

SLO = {"ttft_s": 0.5}


def knee(
    strategy: str, estimate: float | None, low: float | None, high: float | None
) -> StrategyResult:
    fit = Knee(estimate, low, high, False, ())
    return StrategyResult(strategy, ceiling=10.0, fit=fit, resolved=True)


def test_each_pair_is_one_sentence_with_the_higher_knee_first() -> None:
    lines = answer_lines(
        [knee("orca", 1.0, 0.9, 1.1), knee("vllm", 2.0, 1.8, 2.2), knee("ft", None, None, 0.2)]
    )
    assert lines == [
        "vllm sustains 2x [1.64, 2.44] orca's rate at this SLO on this machine",
        "vllm sustains at least 9x ft's rate at this SLO on this machine",
        "orca sustains at least 4.5x ft's rate at this SLO on this machine",
    ]


def test_a_ratio_whose_interval_holds_one_is_not_separated_and_none_says_why() -> None:
    """The first published answer's case: vllm's low end 0.856 against orca's high end 1.07 is
    at least 0.8x, which no probe of either supports as a lead: not separated. A pair with
    neither end says which knee lacks which."""
    vllm, orca = knee("vllm", None, 0.856, 1.77), knee("orca", None, None, 1.07)
    ft = StrategyResult("ft", note="its ceiling probe served nothing")
    assert answer_lines([vllm, orca, ft]) == [
        "vllm and orca are not separated at this SLO on this machine: vllm's rate over orca's "
        "lies in [0.8, -]",
        "vllm against ft: not measured: ft's knee has no high end (its ceiling probe served "
        "nothing)",
        "orca against ft: not measured: orca's knee has no low end; ft's knee has no high end "
        "(its ceiling probe served nothing)",
    ]
    separated = answer_lines([knee("vllm", None, 1.3, 1.77), knee("orca", None, None, 1.07)])
    assert separated == ["vllm sustains at least 1.21x orca's rate at this SLO on this machine"]


def search_record(rates: dict[str, list[float]]) -> dict:
    knees = []
    for strategy, probed in rates.items():
        middle = probed[1]
        knees.append({
            "strategy": strategy, "ceiling": 4 * middle, "predicted": middle * 1.2,
            "estimate": middle, "low": 0.9 * middle, "high": 1.1 * middle, "cliff": False,
            "below": probed[0], "above": probed[2], "widened_by": 1.0, "resolved": True,
            "note": "",
            "probes": [
                {"kind": "rate", "rate": rate, "requests": 10, "repeat": 0,
                 "run_dir": f"{strategy}/rate-{rate:g}-n10", "quantile": q, "quantile_low": 0.8 * q,
                 "quantile_high": None if q > 1 else 1.5 * q, "over_capacity": q > 1,
                 "met": 9, "counted": 10, "stopped": False, "seconds": 10.0}
                for rate, q in zip(probed, (0.5, 1.0, 2.0), strict=True)
            ],
        })  # fmt: skip
    return {
        "settings": {"strategies": list(rates), "resolution": 0.2},
        "slo": {"ttft_s": 0.5, "attainment": 0.9},
        "drift": {"before_s": 0.02, "after_s": 0.021, "change": 0.05},
        "knees": knees,
    }


def test_a_search_directory_opens_its_report_with_the_answer(tmp_path: Path) -> None:
    rates = {"vllm": [1.0, 2.0, 4.0], "orca": [0.5, 1.0, 2.0]}
    for strategy, probed in rates.items():
        for rate in probed:
            write_run(tmp_path / strategy, RunSpec(name=f"rate-{rate:g}-n10", strategy=strategy,
                                                   rate=rate, ttft=0.1, slo=SLO))  # fmt: skip
    predicted = RunSpec(name="rate-3-n10", strategy="simulated-only", rate=3.0, slo=SLO)
    write_run(tmp_path / "predicted" / "vllm", predicted)
    record = {**search_record(rates), "busy_probes": ["orca/rate-2-n10"]}
    (tmp_path / "search.json").write_text(json.dumps(record))
    page = page_text(build_sweep_report([tmp_path], tmp_path / "report.html"))
    assert page.index("<h2>The answer</h2>") < page.index("All runs")
    assert "shared the machine during 1 probe(s) (orca/rate-2-n10)" in page
    answer = "vllm sustains 2x [1.64, 2.44] orca&#x27;s rate at this SLO on this machine."
    assert answer in page
    assert "moved +5.0% between the first probe and the last" in page
    assert page.count("SLO-ratio quantile by rate") == 2
    assert "simulated-only" not in page  # the prediction's runs are not the measurement
    assert page.count("rate-2-n10") >= 2  # both strategies' probes at 2 req/s are runs in it


def test_the_report_says_what_served_each_contender(tmp_path: Path) -> None:
    rates = {"vllm": [1.0, 2.0, 4.0], "vllm:orca": [0.5, 1.0, 2.0]}
    for name, folder in (("vllm", "vllm"), ("vllm:orca", "vllm_orca")):
        for rate in rates[name]:
            write_run(tmp_path / folder, RunSpec(name=f"rate-{rate:g}-n10", strategy=name,
                                                 rate=rate, ttft=0.1, slo=SLO))  # fmt: skip
    (tmp_path / "vllm_orca" / "server").mkdir()
    (tmp_path / "vllm_orca" / "server" / "server.json").write_text(json.dumps({
        "kind": "vllm", "version": "vllm 0.32.0", "strategy_flags": ["--max-num-seqs", "32"],
        "budget_flags": ["--dtype", "float32"], "flags": ["--threads", "2"], "kv_tokens": 672,
        "startup_s": 61.25,
    }))  # fmt: skip
    contenders = [
        {"name": "vllm", "item": "vllm", "folder": "vllm", "backend": "inprocess", "server": None},
        {"name": "vllm:orca", "item": "server=vllm server.strategy=orca", "folder": "vllm_orca",
         "backend": "openai", "server": "vllm:orca"},
    ]  # fmt: skip
    record = {**search_record(rates), "contenders": contenders}
    (tmp_path / "search.json").write_text(json.dumps(record))
    page = page_text(build_sweep_report([tmp_path], tmp_path / "report.html"))
    assert "What served each contender" in page
    assert "vllm 0.32.0" in page and "--max-num-seqs 32 --dtype float32 --threads 2" in page
    assert "672" in page and "61.2" in page and "in this process" in page
    assert page.count("rate-2-n10") >= 2  # the contender's folder is read for its runs
