"""What a gate reads and writes: metrics by dotted name, identical shares of greedy outputs,
and the HTML page, which draws every claim's interval and escapes what it shows."""

from __future__ import annotations

from servelab.base.records import RequestRecord
from servelab.harness.gate.evaluate import identical_share, metric_value
from servelab.reports.gate_report import COLOURS, gate_page


def _record(rid: str, outputs: list[int], reason: str = "length") -> RequestRecord:
    return RequestRecord(
        id=rid,
        prompt_len=4,
        output_len=len(outputs),
        t_scheduled=0.0,
        token_times=[0.1 * (i + 1) for i in range(len(outputs))],
        output_ids=outputs,
        finish_reason=reason,
    )


def test_metric_values_by_dotted_name() -> None:
    summary = {"output_throughput": 12.5, "ttft": {"p99": 0.25}, "mfu_mean": None}
    assert metric_value(summary, "output_throughput") == 12.5
    assert metric_value(summary, "ttft.p99") == 0.25
    assert metric_value(summary, "mfu_mean") is None
    assert metric_value(summary, "tpot.p50") is None


def test_identical_share_counts_exact_outputs_and_failures_as_different() -> None:
    reference = [_record("a", [1, 2]), _record("b", [3, 4]), _record("c", [5]), _record("d", [6])]
    other = [
        _record("a", [1, 2]),
        _record("b", [3, 9]),
        _record("c", [5], reason="error"),
        _record("d", [6]),
    ]
    assert identical_share(reference, other) == (0.5, ["b", "c"])
    assert identical_share(reference, reference) == (1.0, [])
    assert identical_share(reference, other[:1]) == (0.25, ["b", "c", "d"])


def _claim(name: str, outcome: str, low: float, high: float, bound: float) -> dict:
    return {
        "name": name,
        "statement": f"output_throughput {name} / orca >= {bound}",
        "estimate": (low + high) / 2,
        "low": low,
        "high": high,
        "bound": bound,
        "samples": 3,
        "outcome": outcome,
        "counted": "fail" if outcome != "pass" else "pass",
        "notes": ["a <note>"] if outcome == "fail" else [],
    }


def test_the_page_draws_each_interval_coloured_by_outcome() -> None:
    record = {
        "gate": "g",
        "file": "conf/gates/g.yaml",
        "confidence": 0.95,
        "repeats": 3,
        "elapsed_s": 12.0,
        "read_from": None,
        "passed": False,
        "runs": [{}] * 6,
        "machine": {"fingerprint": "0123456789ab", "cpu": "a CPU"},
        "claims": [
            _claim("<b>", "pass", 1.6, 1.8, 1.5),
            _claim("slow", "fail", 0.2, 0.3, 0.8),
            _claim("close", "inconclusive", 1.4, 1.6, 1.5),
        ],
    }
    page = gate_page(record)
    assert page.count("<svg") == 3
    for outcome in ("pass", "fail", "inconclusive"):  # the interval bar and the estimate's ring
        assert page.count(f'stroke="{COLOURS[outcome]}"') == 2
    assert "&lt;b&gt;" in page and "<b>" not in page
    assert "inconclusive (counts as fail)" in page
    assert "a &lt;note&gt;" in page
    assert "Gate failed: 6 runs measured here, 3 repetitions interleaved" in page
