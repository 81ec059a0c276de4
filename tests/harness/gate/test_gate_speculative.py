"""The speculative gate file reads, and every run it plans composes, before any work."""

from __future__ import annotations

from pathlib import Path

from servelab.harness.gate.collect import composed
from servelab.harness.gate.fingerprint import machine_fingerprint
from servelab.harness.gate.plan import plan_gate
from servelab.harness.gate.spec import load_gate
from servelab.harness.run.compose import compose
from servelab.harness.run.settings import CONF_DIR


def test_the_speculative_gate_composes_every_run_it_plans(tmp_path: Path) -> None:
    spec = load_gate(CONF_DIR / "gates" / "speculative.yaml", machine_fingerprint())
    assert [c.name for c in spec.claims] == [
        "speedup-batch1",
        "tokens-per-forward",
        "lossless[orca-spec-ngram]",
        "lossless[vllm-spec-ngram]",
        "lossless[vllm-spec-layerskip]",
        "lossless[vllm-spec-draft]",
    ]
    plan = plan_gate(spec, tmp_path, [])
    configs = composed(plan, compose)
    assert len(plan.runs) == 3 * 2 + 5
    batch1 = [c for c in configs.values() if c.engine.max_batch_size == 1]
    assert {c.strategy.name for c in batch1} == {"vllm", "vllm-spec-ngram"}
    assert {c.strategy.gamma for c in batch1 if c.strategy.name == "vllm-spec-ngram"} == {8}
