"""Simulated runs pinned to their records: every request's times and every step's shape and
times, digested, for the schedulers' main paths (paged KV with preemption, an admission
policy, chunked prefill, static batching, closed-loop arrivals) under a cost model written
by hand. A simulation is deterministic, so any change to what it records fails here: a
faster simulator must write the same run directory."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import pytest

import servelab.harness.measure.rundir as rundir
from servelab.harness.measure.metrics import summarize
from servelab.harness.measure.rundir import read_requests, read_steps
from servelab.harness.measure.slo.limits import SLO
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.run.simulate.cost_model import StepCostModel

SECONDS_PER_UNIT = {
    "step": 0.004,
    "seqs": 0.0003,
    "tokens": 0.0001,
    "logits_rows": 0.0002,
    "attended_pairs": 2e-7,
    "context_tokens": 3e-6,
}
WORKLOAD = [
    "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
    "workload.num_requests=300", "workload.input_len.dist=uniform_range",
    "workload.input_len.lo=8", "workload.input_len.hi=48",
    "workload.output_len.dist=uniform_range", "workload.output_len.lo=4",
    "workload.output_len.hi=60", "workload.arrival.process=poisson",
    "workload.arrival.rate=40", "engine.kv_budget=96KiB",
]  # fmt: skip
CLOSED_LOOP = [
    "workload.arrival.process=closed_loop", "workload.arrival.rate=null",
    "workload.arrival.concurrency=12",
]  # fmt: skip
# name: (overrides, digest, steps, preemptions, most requests waiting at once)
PINNED = {
    "vllm": (["strategy=vllm"], "6c9887de4af00277", 2927, 204, 197),
    "vllm-shortest-first": (
        ["strategy=vllm", "strategy.policy=shortest_first"],
        "62a043f860a8353e",
        2945,
        201,
        134,
    ),
    "orca-chunked": (
        ["strategy=orca-chunked", "engine.max_num_batched_tokens=32"],
        "c93b4ae04ae12445",
        4414,
        0,
        223,
    ),
    "fastertransformer": (["strategy=fastertransformer"], "54b539cd3d4977ee", 5191, 0, 237),
    "vllm-closed-loop": (["strategy=vllm", *CLOSED_LOOP], "50412088e7d685dc", 2921, 207, 10),
}


def digest(run_dir: Path) -> str:
    """The first 16 hex digits of a sha256 over every request's times and every step's
    shape and times, in record order."""
    hashed = hashlib.sha256()
    for r in read_requests(run_dir):
        fields = (r.id, r.t_scheduled, r.t_admitted, r.t_done, r.token_times, r.preemptions)
        hashed.update(repr((*fields, r.finish_reason)).encode())
    for s in read_steps(run_dir):
        shape = (s.step, s.t_start, s.t_end, s.num_seqs, s.prefill_tokens, s.decode_tokens)
        held = (s.pad_tokens, s.waiting, s.running, s.kv_allocated_slots, s.kv_live_slots)
        hashed.update(repr((*shape, *held, s.preempted, s.delivered)).encode())
    return hashed.hexdigest()[:16]


@pytest.fixture(scope="module")
def cost(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pinned") / "cost.json"
    StepCostModel(SECONDS_PER_UNIT, 0.0005, {"model": "dummy-tiny"}).save(path)
    return path


@pytest.mark.parametrize("name", PINNED)
def test_a_simulated_run_records_exactly_what_it_recorded(name: str, cost: Path, tmp_path):
    overrides, expected, steps, preemptions, waiting = PINNED[name]
    simulated = [*WORKLOAD, *overrides, "backend=simulated", f"simulate.cost_model={cost}"]
    summary = run(compose(simulated), tmp_path, progress=False)
    recorded = read_steps(tmp_path)
    assert summary["completed"] == 300
    assert len(recorded) == steps
    assert sum(s.preempted for s in recorded) == preemptions
    assert max(s.waiting for s in recorded) == waiting
    assert digest(tmp_path) == expected


def test_a_run_summarises_its_records_as_written_and_reads_none_back(
    cost: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary and flags take the records the run held as it wrote them; every
    figure computed again from the files on disk is the same, exactly."""
    read = []
    original = rundir.read_records

    def counted(path: Path, kind: type) -> tuple[list, int]:
        read.append(path.name)
        return original(path, kind)

    monkeypatch.setattr(rundir, "read_records", counted)
    overrides, *_ = PINNED["vllm"]
    cfg = compose([*WORKLOAD, *overrides, "backend=simulated", f"simulate.cost_model={cost}"])
    summary = run(cfg, tmp_path, progress=False)
    assert read == []
    assert not (tmp_path / "report.html").exists()  # drawn by the command that asked, if any
    assert not (tmp_path / "telemetry.csv").exists()  # its clock is virtual: nothing sampled
    assert summary["telemetry"]["source"] == "none" and summary["telemetry"]["samples"] == 0
    assert gc.isenabled()  # paused for the loop only
    from_disk = summarize(read_requests(tmp_path), read_steps(tmp_path), SLO.of_config(cfg))
    assert {key: summary[key] for key in from_disk} == from_disk
