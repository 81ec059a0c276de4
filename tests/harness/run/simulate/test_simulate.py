"""The simulator: the step-cost fit, the virtual-time replay, and a simulated run beside the
real run it was fitted on (tiny model, the real schedulers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord
from servelab.harness.measure.flags import SIMULATED, refusals
from servelab.harness.measure.rundir import read_steps
from servelab.harness.run.compose import compose
from servelab.harness.run.replay import Arrivals
from servelab.harness.run.run import run
from servelab.harness.run.simulate.cost_model import (
    TERMS,
    WARMUP_STEPS,
    StepCostModel,
    StepCounts,
    fit,
)
from tests.tiny import make_requests

TINY = [
    "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
    "workload.num_requests=24", "workload.input_len.value=24", "workload.output_len.value=40",
]  # fmt: skip
TRUE_SECONDS = {
    "step": 0.01,
    "seqs": 0.002,
    "tokens": 0.0005,
    "logits_rows": 0.001,
    "attended_pairs": 1e-6,
    "context_tokens": 2e-5,
}


def _step(index: int, seqs: int, prefill: int, decode: int, pairs: int, context: int) -> StepRecord:
    counts = StepCounts(seqs, prefill + decode, decode, pairs, context)  # logits: decode rows
    seconds = sum(TRUE_SECONDS[t] * v for t, v in zip(TERMS, counts.row(), strict=True))
    return StepRecord(
        step=index, t_start=index * 1.0, t_end=index * 1.0 + seconds, model_s=seconds,
        num_seqs=seqs, prefill_tokens=prefill, decode_tokens=decode, waiting=0, running=seqs,
        kv_allocated_slots=context, kv_live_slots=context, kv_total_slots=4096, kv_waste=0.0,
        preempted=0, logits_rows=decode, attended_pairs=pairs, context_tokens=context,
    )  # fmt: skip


def test_the_fit_recovers_the_seconds_per_unit_of_exact_steps() -> None:
    steps = [
        _step(i, 1 + i % 7, (i * 37) % 300, 1 + i % 5, 50 + (i * 991) % 20000, 30 + (i * 13) % 900)
        for i in range(60)
    ]
    model = fit([steps], {"model": "m"}, ["d"])
    for term, seconds in TRUE_SECONDS.items():
        assert model.seconds_per_unit[term] == pytest.approx(seconds, rel=1e-6), term
    assert model.quality is not None and model.quality.median_error < 1e-9
    assert model.quality.steps == 60 - WARMUP_STEPS and model.quality.warmup == WARMUP_STEPS


def test_a_term_that_would_fit_below_zero_is_held_at_zero() -> None:
    """Steps whose time falls as context grows (an artefact of noise): least squares would
    give context a negative cost; the fit holds it at zero and refits the rest."""
    steps = [_step(i, 2, 0, 2, 100, 100) for i in range(20)]
    steps = [
        StepRecord(**{**s.__dict__, "context_tokens": 100 + 10 * i, "t_end": s.t_end - 1e-4 * i})
        for i, s in enumerate(steps)
    ]
    model = fit([steps], {}, [])
    assert min(model.seconds_per_unit.values()) >= 0.0
    assert model.seconds_per_unit["context_tokens"] == 0.0


def test_closed_loop_arrivals_follow_each_users_delivery() -> None:
    requests = make_requests([[1, 2], [3, 4], [5, 6]], [2, 2, 2])
    arrivals = Arrivals(requests, concurrency=2, think_s=0.5)
    first = arrivals.arrived(0.0)
    assert first == requests[:2] and arrivals.next_arrival() is None
    first[0].t_done = 3.0
    arrivals.completed(first[0])
    assert arrivals.next_arrival() == 3.5 and arrivals.arrived(3.4) == []
    assert arrivals.arrived(3.5) == [requests[2]] and requests[2].t_scheduled == 3.5


@pytest.fixture(scope="module")
def real_and_simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """One real offline run of the tiny model under vllm, a cost model fitted on it, and the
    same run simulated with that model."""
    root = tmp_path_factory.mktemp("simulate")
    offline = [*TINY, "workload.arrival.process=offline", "strategy=vllm", "engine.kv_budget=2MiB"]
    run(compose(offline), root / "real", progress=False)
    cost = root / "cost.json"
    from servelab.commands.fit_steps import main as fit_steps

    fit_steps([str(root / "real"), "--out", str(cost)])
    simulated = [*offline, "backend=simulated", f"simulate.cost_model={cost}"]
    run(compose(simulated), root / "simulated", progress=False)
    return root / "real", root / "simulated", cost


def test_a_simulated_run_schedules_every_step_as_the_real_one(real_and_simulated) -> None:
    """Offline, the real scheduler's plan does not depend on timing: the simulation runs the
    same steps, of the same shapes, and takes the time the fit says those steps take."""
    real_dir, simulated_dir, cost = real_and_simulated
    real, simulated = read_steps(real_dir), read_steps(simulated_dir)

    def shape(step: StepRecord) -> tuple[int, ...]:
        return (
            step.num_seqs, step.prefill_tokens, step.decode_tokens, step.preempted,
            step.attended_pairs, step.context_tokens, step.logits_rows, step.kv_allocated_slots,
        )  # fmt: skip

    assert [shape(s) for s in simulated] == [shape(s) for s in real]
    assert any(s.preempted for s in real) or max(s.num_seqs for s in real) > 1
    real_summary = json.loads((real_dir / "summary.json").read_text())
    summary = json.loads((simulated_dir / "summary.json").read_text())
    assert summary["completed"] == real_summary["completed"] == 24
    assert summary["status"] == "complete"
    # least squares with a step term leaves residuals summing to zero: the fitted steps take,
    # simulated, exactly the time they took for real (the warm-up steps are not fitted); not
    # where the fit held the step term at its bound, zero (a loaded machine's noisy steps can
    # make the unbounded fit's per-step cost negative), and then only about as long

    def busy(steps: list[StepRecord]) -> float:
        return sum(s.t_end - s.t_start for s in steps[WARMUP_STEPS:])

    free = StepCostModel.load(cost).seconds_per_unit["step"] > 0
    assert busy(simulated) == pytest.approx(busy(real), rel=1e-6 if free else 0.01)


def test_a_simulated_run_is_marked_and_refused_by_gates(real_and_simulated) -> None:
    _, simulated_dir, cost = real_and_simulated
    summary = json.loads((simulated_dir / "summary.json").read_text())
    meta = json.loads((simulated_dir / "meta.json").read_text())
    assert SIMULATED in summary["flag_codes"] and refusals(summary)
    assert summary[SIMULATED]["cost_model"] == str(cost) == meta[SIMULATED]["cost_model"]
    assert summary[SIMULATED]["fitted_on"]["model"] == "dummy-tiny"
    with pytest.raises(ConfigError, match="simulated run"):
        from servelab.commands.fit_steps import main as fit_steps

        fit_steps([str(simulated_dir), "--out", str(cost.parent / "again.json")])


def test_a_cost_model_refuses_what_it_was_not_fitted_on(real_and_simulated, tmp_path) -> None:
    _, _, cost = real_and_simulated
    base = [*TINY, "backend=simulated", f"simulate.cost_model={cost}"]
    with pytest.raises(ConfigError, match="fitted on heads 'gqa'"):
        run(compose([*base, "strategy=vllm", "strategy.heads=mha"]), tmp_path / "a")
    with pytest.raises(ConfigError, match="cannot speculate"):
        run(compose([*base, "strategy=vllm-spec-ngram"]), tmp_path / "b")
    with pytest.raises(ConfigError, match="ignore_eos"):
        run(compose([*base, "strategy=vllm", "workload.ignore_eos=false"]), tmp_path / "c")


def test_a_large_shape_simulates_without_its_weights_or_kv_memory(tmp_path) -> None:
    """Llama-2-13B's shape on the meta device: 26 GB of weights and 8 GiB of KV that are
    never allocated, under a cost model written by hand."""
    cost = tmp_path / "cost.json"
    StepCostModel(
        seconds_per_unit={"step": 0.02, "tokens": 1e-4, "context_tokens": 1e-6},
        gap_s=0.0,
        described={"model": "dummy-llama2-13b"},
    ).save(cost)
    overrides = [
        "model=dummy-llama2-13b", "engine.dtype=fp32", "telemetry.roofline=false",
        "workload=random", "workload.num_requests=200", "workload.arrival.process=poisson",
        "workload.arrival.rate=20", "strategy=vllm", "engine.kv_budget=8GiB",
        "backend=simulated", f"simulate.cost_model={cost}",
    ]  # fmt: skip
    summary = run(compose(overrides), tmp_path / "run", progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 200
    steps = read_steps(tmp_path / "run")
    assert steps[0].kv_total_slots == 8 * 2**30 // (40 * 2 * 40 * 128 * 4) // 16 * 16
    first = steps[0]
    expected = (
        0.02 + 1e-4 * (first.prefill_tokens + first.decode_tokens) + 1e-6 * first.context_tokens
    )
    assert first.t_end - first.t_start == pytest.approx(expected)
