"""Where the simulator's error arises (`harness/run/simulate/step_errors.py`): a search's real steps
against the step-cost model its prediction simulated, by kind of step, and the loop's own time
measured and put into a profiled model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord
from servelab.commands.profile_steps import parse_args
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.run.simulate.cost_model import StepCostModel, StepCounts, calibrated
from servelab.harness.run.simulate.profile_steps import profile_steps
from servelab.harness.run.simulate.step_errors import (
    FILE,
    search_step_errors,
    step_kind,
)
from servelab.harness.run.spec import engine_spec
from tests.conftest import servelab
from tests.harness.run.simulate.test_profile_steps import SMALL_GRID, TINY


def step(t_start: float, t_end: float, model_s: float, **counts: int) -> StepRecord:
    fields = {"prefill_tokens": 0, "decode_tokens": 0, "waiting": 0, "running": 1}
    return StepRecord(step=0, t_start=t_start, t_end=t_end, model_s=model_s, num_seqs=1,
                      kv_allocated_slots=0, kv_live_slots=0, kv_total_slots=1, kv_waste=0.0,
                      preempted=0, **{**fields, **counts})  # fmt: skip


def test_a_step_is_prefill_decode_mixed_or_padded() -> None:
    assert step_kind(step(0, 1, 1, prefill_tokens=8)) == "prefill"
    assert step_kind(step(0, 1, 1, decode_tokens=4)) == "decode"
    assert step_kind(step(0, 1, 1, prefill_tokens=8, decode_tokens=4)) == "mixed"
    assert step_kind(step(0, 1, 1, decode_tokens=4, pad_tokens=2)) == "padded"


def test_the_loop_s_own_time_is_measured_and_put_into_a_forwards_only_model() -> None:
    """Steps of 10 ms whose forward took 7 ms, 1 ms apart while work waited: the model's
    per-step seconds grow by the 3 ms outside the forward, its gap becomes the 1 ms; its
    decode steps then predicted as measured (factor 1), and every other kind as they are."""
    runs = [[step(i * 0.011, i * 0.011 + 0.010, 0.007, decode_tokens=1) for i in range(8)]]
    model = StepCostModel({"step": 0.006, "tokens": 0.001}, 0.0, {"model": "m"})
    looped = calibrated(model, runs, ["run"])
    assert looped.seconds_per_unit["step"] == pytest.approx(0.009)
    assert looped.seconds_per_unit["tokens"] == 0.001
    assert looped.gap_s == pytest.approx(0.001)
    assert looped.kind_scale == pytest.approx({"prefill": 1.0, "decode": 1.0, "mixed": 1.0})
    assert looped.calibrated_on == ["run"]


def test_each_kind_of_step_is_scaled_by_its_measured_over_predicted_time(tmp_path: Path) -> None:
    """Decode steps twice as slow as the model says and prefill steps half as slow: each kind
    is predicted by its own factor; mixed, never stepped, by the factor of all the steps."""
    decode = [step(i, i + 0.02, 0.02, decode_tokens=1) for i in range(6)]
    prefill = [step(10 + i, 10 + i + 0.05, 0.05, prefill_tokens=100) for i in range(6)]
    model = StepCostModel({"step": 0.01, "tokens": 0.001}, 0.0, {"model": "m"})
    fitted = calibrated(model, [decode, prefill], ["a", "b"])  # each run's first two left out
    assert fitted.kind_scale["decode"] == pytest.approx(0.02 / 0.011)
    assert fitted.kind_scale["prefill"] == pytest.approx(0.05 / 0.11)
    assert fitted.kind_scale["mixed"] == pytest.approx(4 * 0.07 / (4 * 0.011 + 4 * 0.11))
    assert fitted.step_seconds(StepCounts(1, 1, 1, 1, 1, kind="decode")) == pytest.approx(0.02)
    fitted.save(tmp_path / "model.json")
    assert StepCostModel.load(tmp_path / "model.json") == fitted


@pytest.fixture(scope="module")
def search_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A search's directory as `servelab search` leaves it: real runs of static batching and
    of chunked prefill, and the profiled model its prediction named."""
    root = tmp_path_factory.mktemp("search")
    workload = ["workload=random", "workload.num_requests=12", "engine.max_batch_size=4",
                "workload.input_len={dist:uniform_ratio,mean:40,ratio:0.5}",
                "workload.output_len={dist:uniform_ratio,mean:12,ratio:0.5}",
                "engine.max_num_batched_tokens=64"]  # fmt: skip
    for strategy in ("fastertransformer", "orca-chunked"):
        run(compose([*TINY, *workload, f"strategy={strategy}"]), root / strategy / "rate-1",
            progress=False)  # fmt: skip
    options, _, overrides = parse_args([*SMALL_GRID, f"out={root / 'cost.json'}"])
    profile_steps(engine_spec(compose([*TINY, *overrides])), options, [], progress=False)
    models = {
        strategy: str(root / "cost.json") for strategy in ("fastertransformer", "orca-chunked")
    }
    (root / "search.json").write_text(json.dumps({"cost_models": models}))
    return root


def test_each_strategy_s_steps_are_set_beside_the_model_by_kind(search_dir: Path) -> None:
    errors = {e.strategy: e for e in search_step_errors(search_dir)}
    static, chunked = errors["fastertransformer"], errors["orca-chunked"]
    assert "padded" in [k.kind for k in static.kinds]
    assert "mixed" in [k.kind for k in chunked.kinds] and "padded" not in [
        k.kind for k in chunked.kinds
    ]
    for strategy in errors.values():
        *kinds, whole = strategy.kinds
        assert whole.kind == "all" and whole.errors.steps == sum(k.errors.steps for k in kinds)
        assert all(0 <= k.errors.median_error <= k.errors.p90_error for k in strategy.kinds)
        assert all(k.loop_in_step_s > 0 for k in strategy.kinds)  # a step is more than its forward
        assert strategy.model_gap_s == 0.0  # the grid times forwards only


def test_the_verb_prints_and_writes_the_table(search_dir: Path, tmp_path: Path) -> None:
    code, out, err = servelab("step-errors", str(search_dir))
    assert code == 0, err
    assert "orca-chunked" in out and "mixed" in out and "between steps" in out
    written = json.loads((search_dir / FILE).read_text())
    assert {row["strategy"] for row in written} == {"fastertransformer", "orca-chunked"}
    (tmp_path / "search.json").write_text("{}")
    with pytest.raises(ConfigError, match="predicted no knees"):
        search_step_errors(tmp_path)
