"""`servelab profile-steps`: the grid's shapes and counts, the fit of a profiled table, and a
profile of the tiny model whose cost model drives a simulated run and is checked against a
held-out real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.commands.profile_steps import parse_args
from servelab.engine.shapes import DECODE, PREFILL, Shape, ShapeRunner
from servelab.harness.measure.calibrate import device_name
from servelab.harness.run.backends.simulated import SimulatedBackend
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.run.simulate.cost_model import TERMS, StepCostModel, StepCounts
from servelab.harness.run.simulate.profile import Grid, ShapeTimer, fit_table
from servelab.harness.run.simulate.profile_steps import ProfileArgs, profile_steps
from servelab.harness.run.spec import engine_spec, run_spec
from tests.conftest import servelab
from tests.harness.run.simulate.test_simulate import TRUE_SECONDS

TINY = ["model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false"]
SMALL_GRID = [
    "prefill_tokens=8,32,64", "prefill_cached=0,64", "decode_rows=1,4,8",
    "decode_context=16,64,128", "subsets=1,2", "repeats=2",
]  # fmt: skip


def test_the_default_grid_has_its_stated_shapes() -> None:
    shapes = Grid().shapes()
    assert len(shapes) == 36
    assert sum(s.kind == PREFILL for s in shapes) == 12
    assert sum(s.kind == DECODE for s in shapes) == 24
    assert len(shapes[::2]) == 18 and len(shapes[::4]) == 9
    assert shapes[0] == Shape(PREFILL, 1, 16, 0) and shapes[11] == Shape(PREFILL, 1, 512, 256)
    assert shapes[12] == Shape(DECODE, 1, 1, 31) and shapes[-1] == Shape(DECODE, 32, 1, 1023)
    assert Grid().kv_slots(16) == 32 * 1040  # 32 rows of 1,025 tokens, in blocks of 16
    assert Grid().kv_slots(1) == 32 * 1025


def test_a_shape_counts_as_the_engine_counts_its_step(tmp_path: Path) -> None:
    """Counts through the engine's own definitions: a chunk of 64 after 256 cached tokens
    scores 64 x 256 pairs against the cache and 64 x 65 / 2 among its own tokens."""
    timer = _simulated_timer(tmp_path, TRUE_SECONDS)
    chunk = timer.profile(Shape(PREFILL, 1, 64, 256), repeats=1, warmup=0)
    assert chunk.counts == StepCounts(1, 64, 1, 64 * 256 + 64 * 65 // 2, 320, kind="prefill")
    decode = timer.profile(Shape(DECODE, 32, 1, 511), repeats=1, warmup=0)
    assert decode.counts == StepCounts(32, 32, 32, 32 * 512, 32 * 512)


def test_the_fit_recovers_the_seconds_per_unit_of_a_timed_grid(tmp_path: Path) -> None:
    """Each shape timed on a forward whose time the known model fixes: the fit finds every
    term; `seqs` and `logits_rows` are equal in every shape, so it finds their sum, split
    evenly, and predicts every step exactly."""
    true = StepCostModel(TRUE_SECONDS, 0.0, {"model": "dummy-tiny"})
    timer = _simulated_timer(tmp_path, TRUE_SECONDS)
    grid = Grid((16, 64, 256), (0, 128), (1, 4, 16), (32, 256))
    table = [timer.profile(shape, repeats=2, warmup=1) for shape in grid.shapes()]
    expected = [true.step_seconds(row.counts) for row in table]
    assert [row.seconds for row in table] == pytest.approx(expected, rel=1e-9)
    fitted = fit_table(table, {"model": "dummy-tiny"}, ["t"])
    for term in ("step", "tokens", "attended_pairs", "context_tokens"):
        assert fitted.seconds_per_unit[term] == pytest.approx(TRUE_SECONDS[term], rel=1e-6)
    assert fitted.seconds_per_unit["seqs"] == pytest.approx(0.0015, rel=1e-6)
    assert fitted.seconds_per_unit["logits_rows"] == pytest.approx(0.0015, rel=1e-6)
    assert fitted.gap_s == 0.0 and fitted.quality is not None
    assert fitted.quality.steps == 12 and fitted.quality.median_error < 1e-9


def test_the_drift_is_the_first_shape_timed_again_after_the_last(tmp_path) -> None:
    """On a virtual clock nothing drifts; a machine that slowed by half meanwhile (every
    term 1.5x) shows the first shape +50% and says the table mixes two speeds."""
    timer = _simulated_timer(tmp_path, TRUE_SECONDS)
    first = timer.profile(Shape(PREFILL, 1, 64, 0), repeats=2, warmup=1)
    steady = timer.drift(first, repeats=2)
    assert steady.change == pytest.approx(0.0, abs=1e-12) and not steady.too_large
    assert steady.line() == (
        f"speed drift: the first shape took {first.seconds * 1e3:.3g} ms at the start and "
        f"{first.seconds * 1e3:.3g} ms after the last (+0.0%)"
    )
    slowed = {term: seconds * 1.5 for term, seconds in TRUE_SECONDS.items()}
    timer.shapes.runner.cost = StepCostModel(slowed, 0.0, {"model": "dummy-tiny"})
    drifted = timer.drift(first, repeats=2)
    assert drifted.change == pytest.approx(0.5, rel=1e-9) and drifted.too_large
    assert drifted.line().endswith(
        "(+50.0%); over 10%, the table mixes two speeds of this machine: profile again when "
        "it is quiet"
    )
    assert drifted.to_json()["shape"] == {"kind": PREFILL, "rows": 1, "new_tokens": 64, "cached": 0}


def test_grid_arguments_are_read_and_checked() -> None:
    options, run_dirs, overrides = parse_args(
        ["runs/a", "prefill_tokens=8,16", "decode_rows=2", "model=dummy-tiny", "out=x.json"]
    )
    assert run_dirs == [Path("runs/a")] and overrides == ["model=dummy-tiny"]
    assert options.out == "x.json" and options.grid() == Grid(
        prefill_tokens=(8, 16), decode_rows=(2,)
    )
    with pytest.raises(ConfigError, match="profile.decode_rows"):
        ProfileArgs(decode_rows="4,0").grid()
    with pytest.raises(ConfigError, match="profile.subsets"):
        ProfileArgs(subsets="two").every()


def test_a_grid_too_coarse_to_fit_is_refused_before_any_work() -> None:
    code, _, err = servelab("profile-steps", *TINY, *SMALL_GRID, "subsets=1,4")
    assert code == 2
    assert "profile.subsets: 4 shapes; a fit of 6 terms needs at least 6" in err


def test_a_shape_longer_than_the_context_is_refused() -> None:
    code, _, err = servelab("profile-steps", *TINY, *SMALL_GRID, "decode_context=16,1024")
    assert code == 2 and "profile.decode_context" in err and "holds 512" in err


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real run of the tiny model (held out), then the profile of the same model checked
    against it."""
    root = tmp_path_factory.mktemp("profile")
    real = [
        *TINY, "strategy=vllm", "workload=random", "workload.num_requests=12",
        "workload.input_len.value=24", "workload.output_len.value=16",
        "workload.arrival.process=offline",
    ]  # fmt: skip
    run(compose(real), root / "real", progress=False)
    return root, root / "real"


def test_a_profile_writes_its_table_and_a_model_that_drives_a_simulated_run(profiled) -> None:
    root, real = profiled
    options, _, overrides = parse_args([*SMALL_GRID, f"out={root / 'cost.json'}"])
    profile = profile_steps(
        engine_spec(compose([*TINY, *overrides])), options, [real], progress=False
    )
    table = json.loads((root / "cost.grid.json").read_text())
    assert table["described"]["model"] == "dummy-tiny" and table["repeats"] == 2
    assert len(table["shapes"]) == 15 and len(profile.table) == 15
    assert set(TERMS[1:]) <= set(table["shapes"][0])
    assert all(len(row["samples"]) == 2 for row in table["shapes"])
    assert table["drift"]["before_s"] == table["shapes"][0]["seconds"] == profile.drift.before_s
    assert table["drift"]["after_s"] == profile.drift.after_s > 0
    assert [s.model.quality.steps for s in profile.subsets] == [15, 8]
    assert all(s.held_out is not None and s.held_out.steps > 0 for s in profile.subsets)
    loaded = StepCostModel.load(root / "cost.json")
    assert loaded == profile.model and loaded.sources == [str(root / "cost.grid.json")]
    assert loaded.measured_on == device_name(torch.device("cpu"))  # the CPU's model, threads
    simulated = [
        *TINY, "strategy=orca", "workload=random", "workload.num_requests=20",
        "workload.ignore_eos=true", "backend=simulated",
        f"simulate.cost_model={root / 'cost.json'}",
    ]  # fmt: skip
    summary = run(compose(simulated), root / "simulated", progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 20
    assert summary["simulated"]["measured_on"] == loaded.measured_on


def test_a_held_out_run_of_something_else_is_refused(profiled) -> None:
    root, real = profiled
    options, _, overrides = parse_args(SMALL_GRID)
    with pytest.raises(ConfigError, match="this profile is of"):
        profile_steps(
            engine_spec(compose([*TINY, "strategy.heads=mha", *overrides])), options, [real]
        )


def _simulated_timer(root: Path, seconds_per_unit: dict[str, float]) -> ShapeTimer:
    """A timer over the tiny model's shape on the meta device, each forward taking on a
    virtual clock the time these seconds per unit say."""
    path = root / "true.json"
    StepCostModel(seconds_per_unit, 0.0, {"model": "dummy-tiny"}).save(path)
    backend = SimulatedBackend(run_spec(
        compose([*TINY, "strategy=vllm", "workload=random", "workload.ignore_eos=true",
                 "engine.kv_budget=32MiB", "backend=simulated", f"simulate.cost_model={path}"])
    ))  # fmt: skip
    engine = backend.engine
    return ShapeTimer(
        ShapeRunner(engine.runner, engine.kv, engine.decoder, 49152, clock=backend.clock)
    )
