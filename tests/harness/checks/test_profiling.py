"""The profiler window (`profile.enabled=true`): a run's trace with each step of the window
labelled, and what `trace_steps` reads back from a trace per step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.base.records import StepRecord
from servelab.engine.model_runner import StepShape
from servelab.engine.step_update import StepResult
from servelab.harness.checks.profiling import SUMMARY_NAME, TRACE_NAME, StepProfiler
from servelab.harness.checks.trace_steps import step_traces
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run


def result_of(step: int, prefill_tokens: int = 0, decode_tokens: int = 4) -> StepResult:
    record = StepRecord(
        step=step, t_start=0.0, t_end=0.0, model_s=0.0, num_seqs=4,
        prefill_tokens=prefill_tokens, decode_tokens=decode_tokens, waiting=0, running=4,
        kv_allocated_slots=0, kv_live_slots=0, kv_total_slots=0, kv_waste=0.0, preempted=0,
    )  # fmt: skip
    return StepResult(delivered=[], record=record, shape=StepShape.EMPTY)


def run_steps(profiler: StepProfiler, steps: int) -> None:
    weight = torch.randn(32, 32)
    for step in range(steps):
        profiler.step_started(step)
        torch.relu(torch.randn(8, 32) @ weight)
        profiler.step_finished(result_of(step, prefill_tokens=8 if step == 0 else 0))


def test_step_profiler_traces_only_its_window(tmp_path: Path) -> None:
    profiler = StepProfiler(True, first_step=1, num_steps=2, out_dir=tmp_path)
    run_steps(profiler, 5)
    trace = profiler.close()
    assert trace == tmp_path / TRACE_NAME
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"engine step 1", "engine step 2"} <= names
    assert not {"engine step 0", "engine step 3", "engine step 4"} & names
    assert "aten::mm" in names
    steps = json.loads((tmp_path / SUMMARY_NAME).read_text())["steps"]
    assert [s["step"] for s in steps] == [1, 2]
    # randn, mm, relu: three outermost operators each (the mm's own children not counted)
    assert [(s["kind"], s["host_ops"], s["kernels"]) for s in steps] == [("decode", 3, 0)] * 2


def test_step_profiler_writes_the_window_a_run_ended_inside(tmp_path: Path) -> None:
    profiler = StepProfiler(True, first_step=2, num_steps=10, out_dir=tmp_path)
    run_steps(profiler, 4)
    trace = profiler.close()
    assert trace == tmp_path / TRACE_NAME
    names = {event.get("name") for event in json.loads(trace.read_text())["traceEvents"]}
    assert {"engine step 2", "engine step 3"} <= names


def test_step_profiler_disabled_or_never_reached_writes_nothing(tmp_path: Path) -> None:
    for profiler in (
        StepProfiler(False, first_step=0, num_steps=1, out_dir=tmp_path),
        StepProfiler(True, first_step=50, num_steps=1, out_dir=tmp_path),
    ):
        run_steps(profiler, 3)
        assert profiler.close() is None
    assert list(tmp_path.iterdir()) == []


def test_step_profiler_rejects_an_empty_window(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^profile\.num_steps: must be 1 or more, got 0"):
        StepProfiler(True, first_step=0, num_steps=0, out_dir=tmp_path)


@pytest.mark.integration
def test_a_profiled_run_labels_each_step_of_its_window(tmp_path: Path) -> None:
    cfg = compose([
        "model=dummy-tiny", "strategy=vllm", "engine.dtype=fp32", "telemetry.roofline=false",
        "profile.enabled=true", "profile.first_step=3", "profile.num_steps=4",
    ])  # fmt: skip
    summary = run(cfg, tmp_path, progress=False)
    assert summary["status"] == "complete"
    events = json.loads((tmp_path / TRACE_NAME).read_text())["traceEvents"]
    labels = sorted(e["name"] for e in events if str(e.get("name")).startswith("engine step"))
    assert labels == [f"engine step {n}" for n in (3, 4, 5, 6)]
    steps = json.loads((tmp_path / SUMMARY_NAME).read_text())["steps"]
    assert [s["step"] for s in steps] == [3, 4, 5, 6]
    layers = 2  # the tiny shape's: every decode step dispatches operators for each
    assert all(s["kind"] in ("decode", "prefill", "mixed") for s in steps)
    assert all(s["host_ops"] > 4 * layers and s["wall_s"] > 0 for s in steps)


def span(cat: str, name: str, ts: float, dur: float, correlation: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def test_a_gpu_steps_kernels_are_those_it_launched_and_busy_is_their_union() -> None:
    """A trace as torch.profiler writes it on CUDA (microseconds): kernels run after their
    launch, so a kernel is the step's whose launch call (same correlation id) lies inside."""
    events = [
        span("user_annotation", "engine step 7", 0, 100),
        span("cpu_op", "aten::linear", 5, 30),
        span("cpu_op", "aten::mm", 10, 20),  # inside the linear: not its own dispatch
        span("cuda_runtime", "cudaLaunchKernel", 12, 2, correlation=1),
        span("cuda_driver", "cuLaunchKernelEx", 40, 2, correlation=2),  # a Triton launch
        span("cuda_runtime", "cudaMemcpyAsync", 50, 2, correlation=3),
        span("kernel", "gemm", 20, 30, correlation=1),
        span("kernel", "decode_attention", 45, 15, correlation=2),  # overlaps the gemm
        span("gpu_memcpy", "Memcpy HtoD", 70, 10, correlation=3),
        span("user_annotation", "engine step 8", 100, 50),
        span("cuda_runtime", "cudaLaunchKernel", 110, 2, correlation=4),
        span("kernel", "gemm", 112, 5, correlation=4),  # launched in step 8
    ]
    seven, eight = step_traces(events)
    assert (seven.step, seven.host_ops, seven.kernels, seven.copies) == (7, 1, 2, 1)
    assert seven.gpu_busy_s == pytest.approx(50e-6)  # [20, 60) and [70, 80)
    assert seven.gpu_busy_share == pytest.approx(0.5)
    assert (eight.step, eight.kernels, eight.gpu_busy_s) == (8, 1, pytest.approx(5e-6))
