"""`replay.skip_idle`: a replay with nothing in flight jumps its clock to the next arrival
instead of waiting; arrivals keep their schedule and no request is in flight across a jump."""

from __future__ import annotations

import json

import pytest

from servelab.harness.measure.rundir import RunWriter
from servelab.harness.run.build import build_engine
from servelab.harness.run.clock import RunClock
from servelab.harness.run.replay import replay, requests_of
from servelab.workloads.hashing import workload_hash
from servelab.workloads.spec import RequestSpec, Workload
from tests.tiny import engine_settings, random_prompts, strategy, tiny_model


def test_the_clock_moves_forward_only_and_keeps_each_span_it_skipped() -> None:
    clock = RunClock()
    clock.skip_to(100.0)
    assert 100.0 <= clock() < 200.0 and clock.skipped[0][1] == 100.0
    clock.skip_to(50.0)  # the past: nothing to skip
    assert len(clock.skipped) == 1 and clock() >= 100.0
    assert clock.skipped_s == pytest.approx(100.0 - clock.skipped[0][0])
    clock.zero()
    assert clock() < 100.0 and clock.skipped == [] and clock.skipped_s == 0.0


def served_with_skips(
    tmp_path, arrivals: list[float], concurrency: int | None = None, think_s: float = 0.0
) -> tuple[RunClock, list[dict]]:
    """A tiny engine serving requests at `arrivals` in real time, skipping idle spans; the
    clock and the request records."""
    model = tiny_model(vocab_size=512)
    clock = RunClock()
    engine = build_engine(
        model, engine_settings(64 * 1024), strategy("iteration", "paged"), clock, None
    )
    specs = tuple(
        RequestSpec(str(i), tuple(prompt), 4, arrival, ignore_eos=True)
        for i, (prompt, arrival) in enumerate(
            zip(random_prompts(len(arrivals), 4, 8, vocab_size=512), arrivals, strict=True)
        )
    )
    hashed = workload_hash(specs, concurrency, think_s)
    workload = Workload("spaced", specs, hashed, concurrency, think_s)
    writer = RunWriter(tmp_path, keep=True)
    clock.zero()
    replay(engine, requests_of(workload), workload, clock, writer, progress=False, skip_idle=clock)
    writer.close()
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    return clock, [json.loads(line) for line in lines]


def assert_nothing_in_flight_across_a_skip(clock: RunClock, records: list[dict]) -> None:
    for begin, end in clock.skipped:
        for record in records:
            assert record["t_done"] <= begin or record["t_scheduled"] >= end, (record, begin)


def test_an_open_loop_replay_skips_to_each_arrival_on_schedule(tmp_path) -> None:
    """Four requests 30 s apart (a 90 s span; the tiny model serves each in milliseconds):
    three jumps, each ending at the next request's arrival, which keeps its scheduled time;
    every request is served, and none is in flight across a jump."""
    arrivals = [0.0, 30.0, 60.0, 90.0]
    clock, records = served_with_skips(tmp_path, arrivals)
    assert [r["t_scheduled"] for r in records] == arrivals
    assert all(r["finish_reason"] == "length" and r["t_send"] >= r["t_scheduled"] for r in records)
    assert [end for _, end in clock.skipped] == arrivals[1:]
    assert clock.skipped_s > 89.0
    assert_nothing_in_flight_across_a_skip(clock, records)


def test_a_closed_loop_replay_skips_its_users_think_time(tmp_path) -> None:
    """One user thinking 20 s between responses: each next request arrives 20 s after the
    previous response was delivered, skipped to rather than waited for."""
    clock, records = served_with_skips(tmp_path, [0.0] * 3, concurrency=1, think_s=20.0)
    records.sort(key=lambda r: r["t_scheduled"])
    for previous, following in zip(records, records[1:], strict=False):
        assert following["t_scheduled"] == pytest.approx(previous["t_done"] + 20.0)
    assert len(clock.skipped) == 2
    assert_nothing_in_flight_across_a_skip(clock, records)


def test_a_run_says_what_it_skipped_and_a_peer_cannot_skip(tmp_path) -> None:
    """Four requests at 0.05 req/s: the summary says what was skipped, and telemetry's jump
    over it is no dropout (nothing was in flight)."""
    from servelab.base.errors import ConfigError
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run

    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.num_requests=4", "workload.input_len.dist=fixed", "workload.input_len.value=8",
        "workload.output_len.value=4", "workload.arrival.process=poisson",
        "workload.arrival.rate=0.05", "replay.skip_idle=true",
    ]  # fmt: skip
    summary = run(compose(overrides), tmp_path / "run", progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 4
    skipped = summary["idle_skipped"]
    assert skipped["spans"] >= 1 and 0 < skipped["s"] < summary["duration_s"]
    assert summary["telemetry"]["samples"] > 0  # sampled on the jumping clock, no dropout
    assert "telemetry_dropout" not in summary["flag_codes"], summary["flags"]
    with pytest.raises(ConfigError, match=r"replay\.skip_idle: in-process runs only"):
        run(compose([*overrides, "backend=openai"]), tmp_path / "peer", progress=False)


def test_a_simulated_run_records_the_same_and_says_what_a_real_one_would_skip(tmp_path) -> None:
    """A simulation's clock jumps over idle spans either way: with `replay.skip_idle` its
    records are byte for byte the same, and its summary says what it skipped, as a real
    run's does (a search charges a simulated probe that much less)."""
    from servelab.harness.run.compose import compose
    from servelab.harness.run.run import run
    from servelab.harness.run.simulate.cost_model import StepCostModel

    cost = tmp_path / "cost.json"
    StepCostModel({"step": 0.004, "tokens": 0.0001}, 0.0, {"model": "dummy-tiny"}).save(cost)
    overrides = [
        "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
        "workload.num_requests=40", "workload.arrival.process=poisson",
        "workload.arrival.rate=2", "backend=simulated", f"simulate.cost_model={cost}",
    ]  # fmt: skip
    waiting = run(compose(overrides), tmp_path / "waits", progress=False)
    skipping = run(compose([*overrides, "replay.skip_idle=true"]), tmp_path / "skips", False)
    for name in ("requests.jsonl", "steps.jsonl"):
        assert (tmp_path / "waits" / name).read_bytes() == (tmp_path / "skips" / name).read_bytes()
    assert "idle_skipped" not in waiting
    spans, seconds = skipping["idle_skipped"]["spans"], skipping["idle_skipped"]["s"]
    assert spans >= 1 and 0 < seconds < skipping["duration_s"]
