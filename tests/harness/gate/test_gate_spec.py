"""Gate files: claims read into typed sides and bounds; every mistake is one line naming the
file, the claim and the key, before any work; absolute timing bounds need this machine's
fingerprint; the plan interleaves repetitions and reverses every other one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.commands.cli import main
from servelab.harness.gate.collect import composed
from servelab.harness.gate.fingerprint import fingerprint_of, machine_fingerprint
from servelab.harness.gate.plan import plan_gate
from servelab.harness.gate.spec import GateSpec, Side, load_gate, parse_gate
from servelab.harness.run.compose import compose
from servelab.harness.run.settings import CONF_DIR

MACHINE = fingerprint_of({"cpu": "a test machine"})
HEAD = """
repeats: 3
overrides: [engine.kv_budget=32MiB]
workloads:
  online: [workload=comparison, workload.num_requests=8]
  exact: [workload=offline, engine.dtype=fp32]
claims:
"""
CLAIMS = """
  - {name: throughput, workload: online, metric: output_throughput, of: vllm,
     over: fastertransformer, at_least: 1.5}
  - {name: ttft, workload: online, metric: ttft.p99, of: vllm, over: orca, at_most: 0.5}
  - {name: waste, workload: online, metric: kv_waste_mean, of: vllm, at_most: 0.1}
  - {name: lossless, kind: identical, workload: exact, of: [orca, vllm]}
  - {name: heads, kind: perplexity, of: vllm strategy.heads=gqa,
     over: vllm strategy.heads=mqa, at_most: 1.0, windows: 2}
"""


def _parse(claims: str, head: str = HEAD) -> GateSpec:
    return parse_gate(head + claims, Path("g.yaml"), MACHINE)


def test_a_gate_file_reads_into_claims() -> None:
    spec = _parse(CLAIMS)
    assert (spec.name, spec.repeats, spec.inconclusive) == ("g", 3, "fail")
    names = [c.name for c in spec.claims]
    assert names == ["throughput", "ttft", "waste", "lossless[orca]", "lossless[vllm]", "heads"]
    throughput, ttft, waste, lossless, _, heads = spec.claims
    assert throughput.statement == ("output_throughput vllm / fastertransformer on online >= 1.5")
    assert (ttft.metric, ttft.direction, ttft.bound) == ("ttft.p99", "at_most", 0.5)
    assert waste.over is None
    assert lossless.over == Side("fastertransformer", ("strategy=fastertransformer",))
    assert (lossless.direction, lossless.bound) == ("at_least", 1.0)
    assert heads.of == Side("vllm strategy.heads=gqa", ("strategy=vllm", "strategy.heads=gqa"))
    assert heads.windows == 2


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        (
            "  - {name: a, workload: online, metric: output_throughput, of: vllm, over: orca}\n",
            "g.yaml: claims[0] (a): give exactly one bound",
        ),
        (
            "  - {name: a, workload: online, metric: output_throughput, of: vllm, over: orca,"
            " at_least: 1, at_most: 2}\n",
            "g.yaml: claims[0] (a): give exactly one bound",
        ),
        (
            "  - {name: a, workload: online, metric: speed, of: vllm, over: orca, at_least: 1}\n",
            "g.yaml: claims[0] (a).metric: 'speed' is not a summary metric",
        ),
        (
            "  - {name: a, workload: nowhere, metric: steps, of: vllm, at_least: 1}\n",
            "g.yaml: claims[0] (a).workload: 'nowhere' is not one of",
        ),
        (
            "  - {name: a, workload: online, metric: steps, of: nosuch, at_least: 1}\n",
            "strategy: unknown preset 'nosuch'",
        ),
        (
            "  - {name: a, workload: online, metric: steps, of: heads=mqa, at_least: 1}\n",
            "g.yaml: claims[0] (a).of: 'heads=mqa': start with one strategy preset",
        ),
        (
            "  - {name: a, workload: online, metric: steps, of: vllm, at_lest: 1}\n",
            "g.yaml: claims[0].at_lest: unknown key",
        ),
        (
            "  - {name: a, kind: identical, workload: exact, of: vllm, at_most: 1}\n",
            "an identical claim bounds the share from below",
        ),
        (
            "  - {name: a, workload: online, metric: steps, of: vllm, at_least: 1, windows: 2}\n",
            "g.yaml: claims[0] (a).windows: only a perplexity claim",
        ),
        (
            "  - {name: a, workload: online, metric: steps, of: vllm, at_least: 1}\n"
            "  - {name: a, workload: online, metric: steps, of: orca, at_least: 1}\n",
            "g.yaml: gate.claims: claim names must differ; 'a' repeats",
        ),
        (
            "  - {name: a, workload: online, metric: output_throughput, of: vllm, at_least: 50}\n",
            f"add this machine's (fingerprint: {MACHINE.id}",
        ),
        (
            "  - {name: a, workload: online, metric: ttft.p99, of: vllm, at_most: 2,"
            " fingerprint: 0123456789ab}\n",
            f"bound recorded on machine 0123456789ab, this is {MACHINE.id}",
        ),
        (
            "  - {name: a, workload: online, metric: ttft.p99, of: vllm, over: orca, at_most: 2,"
            " fingerprint: 0123456789ab}\n",
            "only an absolute bound on a timing metric takes one",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_the_key(claims: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        _parse(claims)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (
            "repeats: 1\nworkloads: {w: [workload=offline]}\nclaims:\n",
            "g.yaml: gate.repeats: 1 must be a number in [2, 1000]",
        ),
        (
            "inconclusive: maybe\nworkloads: {w: [workload=offline]}\nclaims:\n",
            "g.yaml: gate.inconclusive: 'maybe' is not one of: pass, fail",
        ),
        ("workloads: {w: [offline]}\nclaims:\n", "g.yaml: gate.workloads.w: ['offline']"),
        ("workload: {w: [workload=offline]}\nclaims:\n", "g.yaml: gate.workload: unknown key"),
    ],
)
def test_gate_settings_are_checked(head: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as error:
        _parse("  - {name: a, workload: w, metric: steps, of: vllm, at_least: 1}\n", head)
    assert message in str(error.value)


def test_an_absolute_timing_bound_applies_on_its_own_machine() -> None:
    claim = f"  - {{name: a, workload: online, metric: ttft.p99, of: vllm, at_most: 2, fingerprint: {MACHINE.id}}}\n"  # noqa: E501
    assert _parse(claim).claims[0].bound == 2.0


def test_runs_interleave_and_every_other_repetition_runs_backwards() -> None:
    spec = _parse(CLAIMS)
    plan = plan_gate(spec, Path("/g"), ["model=dummy-tiny"])
    order = [(s.cell.workload, s.cell.side.label, s.repetition + 1) for s in plan.runs]
    first = [
        ("online", "vllm", 1),
        ("online", "fastertransformer", 1),
        ("online", "orca", 1),
        ("exact", "orca", 1),
        ("exact", "fastertransformer", 1),
        ("exact", "vllm", 1),
    ]
    online = ["vllm", "fastertransformer", "orca"]
    assert order == [
        *first,
        *[("online", s, 2) for s in reversed(online)],
        *[("online", s, 3) for s in online],
    ]
    slot = plan.runs_of("online", spec.claims[0].of)[1]
    assert slot.run_dir == Path("/g/online/vllm/rep-2")
    assert slot.overrides == (
        "engine.kv_budget=32MiB",
        "workload=comparison",
        "workload.num_requests=8",
        "strategy=vllm",
        "model=dummy-tiny",
    )
    heads = [(p.side.label, p.windows, p.path.name) for p in plan.perplexities]
    assert heads == [
        ("vllm strategy.heads=gqa", 2, "vllm_strategy.heads-gqa-w2.json"),
        ("vllm strategy.heads=mqa", 2, "vllm_strategy.heads-mqa-w2.json"),
    ]


def test_a_missing_gate_file_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(sys, "argv", ["servelab", "gate", str(tmp_path / "none.yaml")])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        f"servelab: error: gate: {tmp_path / 'none.yaml'} is not a file; give a "
        "gate file, e.g. conf/gates/headline.yaml"
    ]


def test_strategies_that_would_share_a_directory_are_refused() -> None:
    claims = (
        "  - {name: a, workload: online, metric: steps, of: vllm strategy.block_size=8,"
        " over: 'vllm +strategy.block_size=8', at_least: 1}\n"
    )
    with pytest.raises(ConfigError, match="share /g/online/vllm_strategy.block_size-8/rep-1"):
        plan_gate(_parse(claims), Path("/g"), [])


def test_the_fingerprint_verb_prints_this_machines(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["servelab", "gate", "fingerprint"])
    main()
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"fingerprint: {machine_fingerprint().id}"


def test_the_headline_gate_composes_every_run_it_plans(tmp_path: Path) -> None:
    spec = load_gate(CONF_DIR / "gates" / "headline.yaml", machine_fingerprint())
    assert [c.name for c in spec.claims] == [
        "throughput",
        "ttft-p99",
        "kv-waste",
        "lossless[orca]",
        "lossless[orca-chunked]",
        "lossless[vllm]",
        "mqa-quality",
    ]
    plan = plan_gate(spec, tmp_path, [])
    configs = composed(plan, compose)
    assert len(plan.runs) == 3 * 3 + 4 and len(configs) == len(plan.runs) + 2
    online = configs[plan.runs[0].run_dir]
    assert (online.workload.name, online.engine.kv_budget) == ("comparison", "32MiB")
    assert online.engine.dtype == "fp32"
