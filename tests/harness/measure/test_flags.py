"""Flags: each rule raises its flag on the bad side of its bound and not on the good side,
the run report and the sweep report show every flag, and a gate refuses a claim that reads a
flagged run (outcome `refused`, counted as a fail, the notes naming the run and the flag),
while the test-only step delay and beaten peaks stay notes."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from servelab.base.records import RequestRecord, StepRecord
from servelab.harness.gate.collect import Measurements, RunMeasure
from servelab.harness.gate.evaluate import evaluate
from servelab.harness.gate.fingerprint import fingerprint_of
from servelab.harness.gate.plan import plan_gate
from servelab.harness.gate.spec import parse_gate
from servelab.harness.measure.bootstrap import Outcome
from servelab.harness.measure.flags import (
    BUSY_MACHINE,
    PREEMPTION_STORM,
    SEND_LAG,
    TELEMETRY_DROPOUT,
    Flag,
    add_flags,
    busy_machine,
    in_flight_spans,
    refusals,
    step_dropouts,
    summary_flags,
    telemetry_dropouts,
)
from servelab.reports.run_report import build_run_report
from servelab.reports.sweep_report import build_sweep_report


def _codes(flags: list[Flag]) -> list[str]:
    return [f.code for f in flags]


def _summary(**values) -> dict:
    base = {"failed": 0, "completed": 20, "preemptions": 0, "send_lag": {"p99": 0.001}}
    return {**base, **values}


def test_failed_requests_and_send_lag_are_flagged() -> None:
    assert summary_flags(_summary()) == []
    assert _codes(summary_flags(_summary(failed=1))) == ["failed_requests"]
    assert _codes(summary_flags(_summary(send_lag={"p99": 0.2}))) == [SEND_LAG]


@pytest.mark.parametrize(
    ("preemptions", "completed", "storm"),
    [(20, 20, False), (21, 20, True), (9, 1, False), (10, 1, True), (10, 0, True)],
)
def test_a_preemption_storm_is_more_than_one_preemption_per_completed_request(
    preemptions: int, completed: int, storm: bool
) -> None:
    flags = summary_flags(_summary(preemptions=preemptions, completed=completed))
    assert (_codes(flags) == [PREEMPTION_STORM]) is storm


def _step(
    n: int, start: float, busy: bool = True, length: float = 0.01, delivered: int = 0
) -> StepRecord:
    return StepRecord(
        step=n,
        t_start=start,
        t_end=start + length,
        model_s=length,
        num_seqs=1,
        prefill_tokens=0,
        decode_tokens=1,
        waiting=0,
        running=int(busy),
        kv_allocated_slots=0,
        kv_live_slots=0,
        kv_total_slots=64,
        kv_waste=0.0,
        preempted=0,
        delivered=delivered,
    )


def test_missing_steps_and_stalls_with_work_queued_are_dropouts() -> None:
    steady = [_step(i, i * 0.02) for i in range(50)]
    assert step_dropouts(steady) == []
    idle_gap = [*steady[:25], *[_step(i, 10 + i * 0.02) for i in range(25, 50)]]
    idle_gap[24] = _step(24, 24 * 0.02, busy=False)  # nothing queued: an idle engine waits
    assert step_dropouts(idle_gap) == []
    # the step that finished and delivered the last running request: nothing is left queued
    # (its `running` still counts that request, as every step record counts those it finishes)
    idle_gap[24] = _step(24, 24 * 0.02, busy=True, delivered=1)
    assert step_dropouts(idle_gap) == []
    stalled = [*steady[:25], *[_step(i, 10 + i * 0.02) for i in range(25, 50)]]
    (flag,) = step_dropouts(stalled)
    assert flag.code == TELEMETRY_DROPOUT and "gap(s) between steps" in flag.text
    holed = [s for s in steady if s.step != 30]
    (flag,) = step_dropouts(holed)
    assert flag.text == "1 step records missing from steps.jsonl"


def served_record(name: str, arrival: float, done: float) -> RequestRecord:
    return RequestRecord(name, 8, 1, arrival, [done], [7], "length", t_done=done)


def test_a_gap_in_telemetry_samples_while_requests_are_in_flight_is_a_dropout(
    tmp_path: Path,
) -> None:
    """Samples every 50 ms to 4.95 s, then one at 9 s: a 4 s gap (bound: 40 periods = 2 s).
    It is a dropout where requests were in flight through it; not where none was (nothing
    to measure, and what a replay skipping idle spans leaves), nor where one was for less
    than the bound of it."""
    path = tmp_path / "telemetry.csv"
    path.write_text("t,rss\n" + "".join(f"{i * 0.05},1\n" for i in range(100)))
    served = [served_record("a", 0.0, 9.5)]
    assert telemetry_dropouts(path, 0.05, in_flight_spans(served)) == []
    path.write_text(path.read_text() + "9.0,1\n")
    (flag,) = telemetry_dropouts(path, 0.05, in_flight_spans(served))
    assert flag == Flag(
        TELEMETRY_DROPOUT,
        "1 gap(s) in telemetry.csv while requests were in flight, longest 4.05 s > 2.00 s",
    )
    apart = [
        served_record("a", 0.0, 4.9),
        served_record("b", 6.0, 7.5),
        served_record("c", 9.0, 9.5),
    ]
    assert in_flight_spans(apart) == [(0.0, 4.9), (6.0, 7.5), (9.0, 9.5)]
    assert telemetry_dropouts(path, 0.05, in_flight_spans(apart)) == []
    unfinished = [RequestRecord("d", 8, 0, 5.0, [], [], "error")]
    assert in_flight_spans(unfinished) == [(5.0, float("inf"))]
    assert len(telemetry_dropouts(path, 0.05, in_flight_spans(unfinished))) == 1


def test_gates_refuse_doubtful_runs_but_not_the_test_delay_or_beaten_peaks() -> None:
    summary = {"status": "complete"}
    add_flags(summary, [Flag("test_step_delay", "slowed"), Flag("peaks_beaten", "MFU high")])
    assert refusals(summary) == []
    add_flags(summary, [Flag(PREEMPTION_STORM, "storm")])
    assert refusals(summary) == ["slowed", "MFU high", "storm"]
    assert refusals({"status": "incomplete", "flags": []}) == ["incomplete"]


GATE = """
repeats: 2
workloads:
  w: [workload=smoke]
claims:
  - {name: speed, workload: w, metric: output_throughput, of: vllm, over: orca, at_least: 1.1}
  - {name: same, kind: identical, workload: w, of: vllm, over: orca}
"""


def test_a_gate_claim_reading_a_flagged_run_is_refused(tmp_path: Path) -> None:
    spec = parse_gate(GATE, Path("g.yaml"), fingerprint_of({"cpu": "a test machine"}))
    plan = plan_gate(spec, tmp_path, [])
    runs = []
    for slot in plan.runs:
        summary = {"status": "complete", "output_throughput": 10.0}
        if slot.cell.side.label == "vllm" and slot.repetition == 1:
            add_flags(summary, [Flag("failed_requests", "3 requests failed or were rejected")])
        runs.append(RunMeasure(slot, summary, 0.0))
    speed, same = evaluate(spec, plan, Measurements(runs, []))
    for result in (speed, same):
        assert (result.outcome, result.counted) == (Outcome.REFUSED, Outcome.FAIL)
        assert result.estimate is None
        (note,) = result.notes
        assert "vllm/rep-2 is flagged: 3 requests failed or were rejected" in note


def _run_dir(root: Path, name: str, flags: list[str]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    strategy = {"name": name, "batching": "iteration", "kv": "paged"}
    config = {"strategy": strategy, "workload": {"name": "w", "arrival": {"rate": 1.0}}}
    (run / "config.yaml").write_text(json.dumps(config))
    record = {
        "id": "0",
        "prompt_len": 3,
        "output_len": 2,
        "t_scheduled": 0.0,
        "t_send": 0.0,
        "t_done": 0.2,
        "token_times": [0.1, 0.2],
        "output_ids": [5, 6],
        "finish_reason": "length",
        "error": None,
    }
    (run / "requests.jsonl").write_text(json.dumps(record) + "\n")
    summary = {"status": "complete", "completed": 1, "failed": 0, "flags": flags}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_every_report_that_shows_a_run_shows_its_flags(tmp_path: Path) -> None:
    flag = "preemption storm: 50 preemptions for 2 completed requests (25.0 each > 1)"
    flagged = _run_dir(tmp_path / "sweep", "vllm", [flag])
    _run_dir(tmp_path / "sweep", "orca", [])
    page = build_run_report(flagged).read_text()
    assert f"Flagged: {html.escape(flag)}" in page
    sweep = build_sweep_report([tmp_path / "sweep"], tmp_path / "sweep.html").read_text()
    assert sweep.count(html.escape(flag)) == 2  # above the group's figures, and in its row


def test_other_processes_busy_while_requests_were_in_flight_flag_the_run(tmp_path: Path) -> None:
    """Samples every second to 10 s, other processes at 90% of a core from 5 s to 10 s and
    at 10% before: flagged over a request in flight from 4 to 10 s (mean 77%), not over one
    from 0 to 5 s (10%); a file without the column flags nothing."""
    path = tmp_path / "telemetry.csv"
    shares = [10.0] * 6 + [90.0] * 5  # the row at t is the share since t - 1
    path.write_text("t,others_cpu_pct\n" + "".join(f"{t},{s}\n" for t, s in enumerate(shares)))
    (flag,) = busy_machine(path, in_flight_spans([served_record("a", 4.0, 10.0)]))
    assert flag.code == BUSY_MACHINE and flag.text.startswith("other processes used 77% of a")
    assert busy_machine(path, in_flight_spans([served_record("a", 0.0, 5.0)])) == []
    path.write_text("t,cpu_pct\n0,100\n1,100\n")
    assert busy_machine(path, in_flight_spans([served_record("a", 0.0, 1.0)])) == []


def test_the_summary_on_screen_ends_with_the_flags() -> None:
    from io import StringIO

    from rich.console import Console

    from servelab.harness.measure.summary_table import render_summary
    from tests.reports_rundirs import RunSpec, requests_of, summary_of

    spec = RunSpec(extra_summary={"preemptions": 0})
    summary = summary_of(spec, requests_of(spec))
    add_flags(summary, [Flag(BUSY_MACHINE, "other processes used 77% of a core")])
    out = StringIO()
    render_summary(summary, "runs/x", Console(file=out, width=120))
    assert out.getvalue().splitlines()[-2:] == [
        "flag: other processes used 77% of a core",
        "run directory: runs/x",
    ]


def test_the_summary_on_screen_gives_a_peer_servers_own_view_and_the_prompt_cache() -> None:
    """A peer's run: the server's scraped gauges (peak / mean) as the server's, no engine step
    figure standing in for them, and the share of prompt tokens served from cache."""
    from io import StringIO

    from rich.console import Console

    from servelab.harness.measure.summary_table import render_summary
    from tests.reports_rundirs import RunSpec, requests_of, summary_of

    spec = RunSpec(extra_summary={"preemptions": 0})
    summary = summary_of(spec, requests_of(spec))
    summary.update(
        peak_running=None, kv_waste_mean=None, cached_prompt_share=0.96, warm_cache_share=0.9,
        server_metrics={"samples": 9, "failed": 0, "running_requests_max": 7.0,
                        "running_requests_mean": 3.25, "waiting_requests_max": None,
                        "waiting_requests_mean": None, "kv_usage_share_max": 0.5,
                        "kv_usage_share_mean": 0.125},
    )  # fmt: skip
    out = StringIO()
    render_summary(summary, "runs/x", Console(file=out, width=120))
    lines = [" ".join(line.split()) for line in out.getvalue().splitlines()]
    assert "server: running requests (peak / mean) 7 / 3.25" in lines
    assert "server: KV cache usage (peak / mean) 0.5 / 0.125" in lines
    assert not any(line.startswith("server: waiting") for line in lines)  # not scraped
    assert "peak running requests -" in lines
    assert (
        "prompt tokens served from a prefix cache 96.0% (90.0% from a cache this run did not fill)"
        in lines
    )
