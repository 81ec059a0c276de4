"""The metric definitions of DESIGN.md on hand-made records, with exact expected values."""

from __future__ import annotations

import math

import pytest

from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.measure.metrics import distribution, request_latency, summarize
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.measure.summary_schema import DISTRIBUTIONS, METRICS, SCALARS, SPECULATIVE


def _request(
    rid: str, arrived: float, times: list[float], prompt: int = 10, **extra
) -> RequestRecord:
    fields = dict(
        id=rid,
        prompt_len=prompt,
        output_len=len(times),
        t_scheduled=arrived,
        t_send=arrived,
        t_done=times[-1] if times else None,
        token_times=times,
        output_ids=list(range(len(times))),
        finish_reason="length",
    )
    fields.update(extra)
    return RequestRecord(**fields)


def _step(t0: float, t1: float, allocated: int, live: int, running: int, **extra) -> StepRecord:
    waste = (allocated - live) / allocated if allocated else 0.0
    fields = dict(
        step=0,
        t_start=t0,
        t_end=t1,
        model_s=(t1 - t0) / 2,
        num_seqs=running,
        prefill_tokens=0,
        decode_tokens=running,
        waiting=0,
        running=running,
        kv_allocated_slots=allocated,
        kv_live_slots=live,
        kv_total_slots=allocated,
        kv_waste=waste,
        preempted=0,
    )
    fields.update(extra)
    return StepRecord(**fields)


def test_request_latencies_follow_the_definitions() -> None:
    lat = request_latency(_request("a", 1.0, [1.5, 1.7, 2.0, 2.5]))
    assert lat.ttft == pytest.approx(0.5)
    assert lat.e2e == pytest.approx(1.5)
    assert lat.tpot == pytest.approx((2.5 - 1.5) / 3)
    assert lat.normalized_latency == pytest.approx(1.5 / 4)


def test_latency_starts_at_arrival_not_when_the_request_was_handed_over() -> None:
    # arrived at 1.0 while the engine was busy; noticed (t_send) at 1.8; first token at 2.0.
    # (Before: TTFT was measured from t_send, 0.2 s instead of the 1.0 s the user waited.)
    lat = request_latency(_request("a", 1.0, [2.0, 2.5], t_send=1.8))
    assert lat.ttft == pytest.approx(1.0)
    assert lat.e2e == pytest.approx(1.5)


def test_e2e_ends_at_delivery_and_tpot_is_the_generation_pace() -> None:
    # static batching held the response until its batch ended at 5.0
    # (before: E2E ended at the last token, 2.0, and TPOT was derived from that E2E)
    lat = request_latency(_request("a", 0.0, [1.0, 1.5, 2.0], t_done=5.0))
    assert lat.e2e == pytest.approx(5.0)
    assert lat.normalized_latency == pytest.approx(5.0 / 3)
    assert lat.tpot == pytest.approx(0.5)
    assert lat.ttft == pytest.approx(1.0)


def test_tpot_undefined_for_a_single_token() -> None:
    assert request_latency(_request("a", 0.0, [0.3])).tpot is None


def test_failed_requests_have_no_latency() -> None:
    assert request_latency(_request("a", 0.0, [], finish_reason="error", error="x")) is None
    assert request_latency(_request("b", 0.0, [], finish_reason="rejected")) is None


def test_distribution_uses_linear_percentiles() -> None:
    stats = distribution([1.0, 2.0, 3.0, 4.0])
    assert stats["mean"] == 2.5
    assert stats["p50"] == 2.5
    assert stats["p90"] == pytest.approx(3.7)
    assert stats["p99"] == pytest.approx(3.97)
    assert stats["std"] == pytest.approx(math.sqrt(1.25))
    assert distribution([])["p50"] is None


def test_summary_throughputs_goodput_and_exclusions() -> None:
    requests = [
        _request("a", 0.0, [1.0, 2.0]),
        _request("b", 1.0, [1.5, 1.6, 1.7, 4.0], prompt=20),
        _request("c", 0.5, [9.0], excluded=True),
        _request("d", 0.2, [], finish_reason="error", error="boom"),
    ]
    steps = [_step(0.0, 1.0, 100, 50, 2), _step(1.0, 4.0, 100, 100, 3)]
    summary = summarize(requests, steps, SLO(ttft_s=0.6))
    assert summary["completed"] == 2
    assert summary["failed"] == 1
    assert summary["excluded"] == 1
    assert summary["duration_s"] == pytest.approx(4.0)  # first arrival 0.0 -> last delivery
    assert summary["request_throughput"] == pytest.approx(0.5)
    assert summary["output_throughput"] == pytest.approx(6 / 4)
    assert summary["total_throughput"] == pytest.approx((6 + 30) / 4)
    assert summary["goodput"] == pytest.approx(1 / 4)  # only b has TTFT <= 0.6
    assert summary["slo_attainment"] == pytest.approx(1 / 3)  # the failed d counts as a miss
    assert summary["sustained"] is False
    assert summary["itl"]["mean"] == pytest.approx((1.0 + 0.1 + 0.1 + 2.3) / 4)
    assert summary["kv_waste_mean"] == pytest.approx((0.5 * 1 + 0.0 * 3) / 4)
    assert summary["peak_running"] == 3
    assert summary["normalized_latency"]["mean"] == pytest.approx((2.0 / 2 + 3.0 / 4) / 2)


def test_step_figures_leave_out_warm_up_and_cool_down() -> None:
    # the counted request arrives at 10 and is delivered at 12: steps outside [10, 12] (the
    # excluded requests' time) do not count in peak running, waste or preemptions
    # (before: every step counted, so the warm-up's peak of 9 and its preemption showed)
    requests = [
        _request("warm", 0.0, [5.0], excluded=True),
        _request("a", 10.0, [11.0, 12.0]),
        _request("cool", 12.5, [20.0], excluded=True),
    ]
    steps = [
        _step(0.0, 5.0, 100, 10, 9, preempted=1),
        _step(10.0, 12.0, 100, 50, 1),
        _step(13.0, 20.0, 100, 100, 4),
    ]
    summary = summarize(requests, steps, SLO())
    assert summary["peak_running"] == 1
    assert summary["preemptions"] == 0
    assert summary["kv_waste_mean"] == pytest.approx(0.5)
    assert summary["steps"] == 1
    assert summary["sustained"] is None  # no SLO configured


def test_old_records_without_t_done_deliver_at_their_last_token() -> None:
    record = RequestRecord.from_json(
        {
            "id": "a",
            "prompt_len": 3,
            "output_len": 2,
            "t_scheduled": 0.0,
            "t_send": 0.0,
            "token_times": [1.0, 2.0],
            "output_ids": [5, 6],
            "finish_reason": "stop",
            "error": None,
            "preemptions": 0,
            "excluded": False,
        }
    )
    assert request_latency(record).e2e == pytest.approx(2.0)


def test_records_round_trip_with_their_counters() -> None:
    step = _step(0.0, 1.0, 8, 4, 2, counters={"kv_blocks_used": 2, "mfu": 0.5})
    payload = step.to_json()
    assert payload["kv_blocks_used"] == 2 and payload["mfu"] == 0.5
    assert StepRecord.from_json(payload) == step


def _spec_step(proposed: int, accepted: int, seqs: int, emitted: int, counts, draft_s: float):
    return _step(
        0.0,
        0.2,
        10,
        10,
        seqs,
        counters={
            "spec_proposed": proposed,
            "spec_accepted": accepted,
            "spec_decode_seqs": seqs,
            "spec_emitted": emitted,
            "spec_accepted_counts": counts,
            "spec_draft_s": draft_s,
        },
    )


def test_speculative_figures_come_from_the_step_counters() -> None:
    steps = [
        # two sequences drafted 4 each: one accepted 4 (+1), one 1 (+1); a third had no draft
        _spec_step(8, 5, 3, 8, [0, 1, 0, 0, 1], 0.05),
        # one drafted 4, all rejected
        _spec_step(4, 0, 1, 1, [1], 0.05),
    ]
    requests = [_request("a", 0.0, [0.1, 0.2])]
    summary = summarize(requests, steps, SLO())
    assert summary["acceptance_rate"] == pytest.approx(5 / 12)
    assert summary["mean_accepted_length"] == pytest.approx(9 / 4)
    assert summary["acceptance_histogram"] == [1, 1, 0, 0, 1]
    assert summary["mean_gamma"] == pytest.approx(4.0)
    # c = draft time / (gamma x target time) = 0.1 / (4 x 0.2)
    assert summary["draft_cost_ratio"] == pytest.approx(0.125)
    alpha = 5 / 12
    expected = (1 - alpha**5) / ((1 - alpha) * (4 * 0.125 + 1))
    assert summary["predicted_speedup"] == pytest.approx(expected)


def test_plain_runs_have_no_speculative_figures() -> None:
    summary = summarize([_request("a", 0.0, [0.1])], [_step(0.0, 0.1, 4, 4, 1)], SLO())
    assert "acceptance_rate" not in summary


def test_summarize_emits_exactly_the_schema_keys() -> None:
    """Every key `summarize` writes has one row in the summary schema (name, unit, label,
    kind, direction), and every scalar and distribution row is written: a new metric cannot
    reach summary.json, the gates or the reports without one."""
    requests = [_request("a", 0.0, [0.5, 0.75, 1.0]), _request("b", 0.25, [1.0, 1.5])]
    steps = [_step(0.0, 0.5, 20, 12, 2), _step(0.5, 1.0, 20, 14, 2)]
    plain = set(summarize(requests, steps, SLO()))
    assert plain == {m.name for m in (*DISTRIBUTIONS, *SCALARS)}
    spec_counters = dict(
        spec_proposed=4, spec_accepted=3, spec_decode_seqs=2, spec_emitted=5,
        spec_accepted_counts=[0, 1, 1], spec_draft_s=0.1,
    )  # fmt: skip
    spec_steps = [_step(0.0, 0.5, 20, 12, 2, counters=dict(spec_counters))]
    speculative = set(summarize(requests, spec_steps, SLO())) - plain
    assert speculative == {m.name for m in SPECULATIVE}
    assert all(m.kind in ("schedule", "timing", "record") for m in METRICS.values())
