"""KV exhaustion end to end (whole runs on the tiny model): a cache far smaller than the load
makes paged strategies preempt (recompute or swap) and contiguous ones queue, never crash;
a request that can never fit is rejected with its reason, recorded, and the run goes on to
serve every other request with the same tokens under every strategy, flagged for the
rejection."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from servelab.harness.measure.rundir import read_requests
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run

BUDGET = "128KiB"  # the tiny model in fp32 keeps 512 bytes per token: 256 slots
STRATEGIES = {
    "vllm": ["strategy=vllm"],
    "vllm-swap": ["strategy=vllm", "strategy.preemption=swap"],
    "orca": ["strategy=orca"],
    "fastertransformer": ["strategy=fastertransformer"],
}


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("workload") / "requests.jsonl"
    lines = [
        {"id": f"r{i}", "prompt_ids": [rng.randint(17, 4000) for _ in range(40)], "max_tokens": 40}
        for i in range(11)
    ]
    giant = {"id": "giant", "prompt_ids": [rng.randint(17, 4000) for _ in range(100)]}
    lines.insert(5, {**giant, "max_tokens": 400})  # 500 tokens of KV: more than the cache
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def outputs(workload: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    results = {}
    for name, overrides in STRATEGIES.items():
        run_dir = tmp_path_factory.mktemp(name)
        cfg = compose(
            [
                "model=dummy-tiny",
                "engine.dtype=fp32",
                f"engine.kv_budget={BUDGET}",
                "telemetry.roofline=false",
                "workload=jsonl",
                f"workload.path={workload}",
                "workload.ignore_eos=true",
                *overrides,
            ]
        )
        summary = run(cfg, run_dir, progress=False)
        results[name] = {"summary": summary, "records": read_requests(run_dir)}
    return results


@pytest.mark.integration
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_an_exhausted_cache_preempts_or_queues_and_the_giant_is_rejected(
    outputs: dict[str, dict], name: str
) -> None:
    summary, records = outputs[name]["summary"], outputs[name]["records"]
    assert summary["status"] == "complete" and summary["error"] is None
    assert (summary["completed"], summary["rejected"], summary["not_recorded"]) == (11, 1, 0)
    (giant,) = [r for r in records if r.id == "giant"]
    assert giant.finish_reason == "rejected"
    assert giant.error == "needs 500 tokens of KV, more than the whole cache holds (256)"
    assert "failed_requests" in summary["flag_codes"]
    assert summary["peak_running"] < 11  # the cache held only some at once
    if name.startswith("vllm"):
        assert summary["preemptions"] > 0


@pytest.mark.integration
def test_every_strategy_serves_the_others_the_same_tokens(outputs: dict[str, dict]) -> None:
    tokens = {
        name: {r.id: r.output_ids for r in result["records"] if r.id != "giant"}
        for name, result in outputs.items()
    }
    reference = tokens.pop("fastertransformer")
    assert len(reference) == 11 and all(len(t) == 40 for t in reference.values())
    for name, served in tokens.items():
        assert served == reference, name
