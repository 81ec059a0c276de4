"""`servelab gate` end to end on the tiny model: a strategy slowed on purpose (the test-only
step delay) fails its claim and the gate exits 1, while the exact claims pass; the runs
interleave; a bound inside a measured interval is inconclusive, never passed, and counts as
the policy says; perplexity claims compare head layouts and flip with their bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.step_delay import step_delay_s
from tests.conftest import servelab

SLOW = "orca +engine.test_step_delay_s=0.5"
HEAD = """
name: tiny
repeats: 2
overrides: [model=dummy-tiny, telemetry.roofline=false, engine.dtype=fp32]
workloads:
  small: [workload=offline, workload.num_requests=2, workload.input_len.lo=8,
          workload.input_len.hi=16, workload.output_len.value=2]
claims:
"""
SLOWED = f"""
  - {{name: slowed, workload: small, metric: output_throughput, of: "{SLOW}", over: orca,
     at_least: 0.8}}
"""
CLAIMS = (
    SLOWED
    + """
  - {name: waste, workload: small, metric: kv_waste_mean, of: orca, at_most: 1.0}
  - {name: lossless, kind: identical, workload: small, of: [vllm], over: orca}
  - {name: heads, kind: perplexity, of: "orca strategy.heads=mqa", over: orca, at_most: 10,
     windows: 1}
"""
)


def _gate(*args: str) -> tuple[int, str, str]:
    """`servelab gate ARGS` in this process: (exit status, stdout, stderr)."""
    return servelab("gate", *args)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, int, str, dict]:
    """One gate measured on the tiny model: its directory, exit status, table and gate.json."""
    root = tmp_path_factory.mktemp("gate")
    (root / "tiny.yaml").write_text(HEAD + CLAIMS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: two threads on a busy 2-core machine stall each other
    try:
        code, table, _ = _gate(str(root / "tiny.yaml"), f"out={root / 'out'}")
    finally:
        torch.set_num_threads(threads)
    return root, code, table, json.loads((root / "out" / "gate.json").read_text())


@pytest.mark.integration
def test_a_slowed_strategy_fails_the_gate(measured) -> None:
    root, code, table, record = measured
    assert code == 1
    assert "gate tiny FAILED: 3 pass, 1 fail, 0 inconclusive; 5 runs measured here" in table
    outcomes = {c["name"]: c["outcome"] for c in record["claims"]}
    assert outcomes == {"slowed": "fail", "waste": "pass", "lossless": "pass", "heads": "pass"}
    slowed = record["claims"][0]
    assert slowed["high"] < 0.8 and slowed["samples"] == 2
    # the suite's other workers share the machine, so a run may carry `busy_machine` too
    notes = [note for note in slowed["notes"] if not note.startswith("other processes used")]
    assert notes == [
        "engine.test_step_delay_s=0.5: every step delayed on purpose (test-only); not real figures"
    ]
    summary = json.loads(
        (root / "out/small/orca_engine.test_step_delay_s-0.5/rep-1/summary.json").read_text()
    )
    assert summary["test_step_delay_s"] == 0.5
    assert set(summary["flags"]) <= set(slowed["notes"]) and notes[0] in summary["flags"]
    assert record["passed"] is False
    page = (root / "out" / "gate.html").read_text()
    assert page.count("<svg") == 4 and "fail" in page


@pytest.mark.integration
def test_runs_interleave_in_the_planned_order(measured) -> None:
    _, _, _, record = measured
    order = [(r["strategy"], r["repetition"]) for r in record["runs"]]
    assert order == [(SLOW, 1), ("orca", 1), ("vllm", 1), ("orca", 2), (SLOW, 2)]


@pytest.mark.integration
def test_a_bound_inside_the_interval_is_inconclusive(measured) -> None:
    root, _, _, record = measured
    slowed = record["claims"][0]
    assert slowed["low"] < slowed["high"]
    middle = (slowed["low"] + slowed["high"]) / 2
    (root / "mid.yaml").write_text(HEAD + SLOWED.replace("0.8}", f"{middle}}}"))
    code, table, _ = _gate(str(root / "mid.yaml"), f"from={root / 'out'}")
    again = json.loads((root / "out" / "gate.json").read_text())["claims"][0]
    assert (again["low"], again["high"]) == (slowed["low"], slowed["high"])
    assert (again["outcome"], again["counted"], code) == ("inconclusive", "fail", 1)
    assert "inconclusive (counts as fail)" in table
    code, _, _ = _gate(str(root / "mid.yaml"), f"from={root / 'out'}", "inconclusive=pass")
    again = json.loads((root / "out" / "gate.json").read_text())["claims"][0]
    assert (again["outcome"], again["counted"], code) == ("inconclusive", "pass", 0)


@pytest.mark.integration
def test_perplexity_claims_compare_head_layouts(measured) -> None:
    root, _, _, record = measured
    heads = record["claims"][3]
    mqa, gqa = heads["values_of"][0], heads["values_over"][0]
    assert mqa != gqa and heads["estimate"] == mqa / gqa
    stored = {
        json.loads(p.read_text())["heads"]: json.loads(p.read_text())["stored_kv_heads"]
        for p in (root / "out" / "perplexity").glob("*.json")
    }
    assert stored == {"mqa": 1, "gqa": 2}
    for factor, expected, status in ((1.001, "pass", 0), (0.999, "fail", 1)):
        claim = f"""
  - {{name: heads, kind: perplexity, of: "orca strategy.heads=mqa", over: orca,
     at_most: {heads["estimate"] * factor}, windows: 1}}
"""
        (root / "heads.yaml").write_text(HEAD + claim)
        code, _, _ = _gate(str(root / "heads.yaml"), f"from={root / 'out'}")
        again = json.loads((root / "out" / "gate.json").read_text())["claims"][0]
        assert (again["outcome"], code) == (expected, status)


@pytest.mark.integration
def test_reading_runs_of_another_configuration_is_refused(measured) -> None:
    root, _, _, _ = measured
    other = HEAD.replace("output_len.value=2", "output_len.value=4") + SLOWED
    (root / "other.yaml").write_text(other)
    code, _, err = _gate(str(root / "other.yaml"), f"from={root / 'out'}")
    assert code == 2
    assert "holds no complete run of this configuration" in err
    assert len(err.strip().splitlines()) == 1


def test_the_step_delay_cannot_be_set_by_accident() -> None:
    with pytest.raises(ConfigCompositionException, match=r"use \+engine\.test_step_delay_s"):
        compose(["model=dummy-tiny", "engine.test_step_delay_s=0.5"])
    cfg = compose(["model=dummy-tiny", "+engine.test_step_delay_s=-1"])
    with pytest.raises(ConfigError, match=r"engine.test_step_delay_s: -1 must be seconds"):
        step_delay_s(cfg.engine)
