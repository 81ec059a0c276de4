"""Step times derived from a hardware description, and `servelab plan` on them (simulated)."""

from __future__ import annotations

import json
import math

import pytest

from servelab.engine.model_runner import StepShape
from servelab.harness.measure.roofline import ModelShape, step_cost
from servelab.harness.run.simulate.cost_model import StepCounts
from servelab.harness.run.simulate.hardware import PRESETS, Hardware, RooflineStepTime
from servelab.models.dummy import DUMMY_SHAPES

LLAMA2_13B = DUMMY_SHAPES["llama2-13b"]


def _timing(hardware: Hardware) -> RooflineStepTime:
    return RooflineStepTime(hardware, ModelShape.of(LLAMA2_13B), 26e9, 2, 40)


def test_a_derived_step_is_the_longer_of_its_compute_and_its_memory_traffic() -> None:
    """One decode row reads the weights: memory decides. 4096 prefill tokens: compute does.
    The work is the roofline module's, from the step's totals or its per-sequence lengths."""
    hardware = Hardware("made up", 100e12, 1e12, 40e9, "a test", ())
    timing = _timing(hardware)
    cases = [([1], [300], 1, "bytes"), ([4096], [4096], 1, "flops")]
    for query_lens, seq_lens, logits, bound in cases:
        shape = StepShape(query_lens, seq_lens, logits)
        work = step_cost(ModelShape.of(LLAMA2_13B), 26e9, query_lens, seq_lens, logits, 2, 2, 40)
        compute_s = work.flops / (100e12 * timing.compute_efficiency)
        memory_s = work.bytes / (1e12 * timing.bandwidth_efficiency)
        expected = timing.step_overhead_s + max(compute_s, memory_s)
        assert timing.step_seconds(StepCounts.of_shape(shape)) == pytest.approx(expected, rel=1e-12)
        assert (memory_s > compute_s) is (bound == "bytes")


def test_more_bandwidth_makes_a_decode_step_faster_and_leaves_a_prefill_step_alone() -> None:
    decode = StepCounts.of_shape(StepShape([1] * 8, [500] * 8, 8))
    prefill = StepCounts.of_shape(StepShape([4096], [4096], 1))
    a100_40, a100_80 = _timing(PRESETS["a100-40gb"]), _timing(PRESETS["a100-80gb"])
    assert a100_80.step_seconds(decode) < a100_40.step_seconds(decode)
    assert a100_80.step_seconds(prefill) == pytest.approx(a100_40.step_seconds(prefill))


def test_plan_tells_devices_memory_and_cost_for_a_13b_shape(tmp_path, capsys) -> None:
    from servelab.commands.plan import main

    main([
        "model=dummy-llama2-13b", "workload=random", "workload.num_requests=32",
        "workload.input_len.dist=fixed", "workload.input_len.value=64",
        "workload.output_len.value=32",
        "slo.ttft_s=2", "slo.tpot_s=0.1", "plan.hardware=[a100-40gb,l4]",
        "plan.strategies=[vllm]", "plan.rate=20", "plan.price_per_hour=3",
        "plan.requests=48", f"plan.out_dir={tmp_path}",
    ])  # fmt: skip
    record = json.loads((tmp_path / "plan.json").read_text())
    a100, l4 = record["rows"]
    weight_gb = a100["weight_gb"]
    assert weight_gb == pytest.approx(2 * 13.0e9 / 1e9, rel=0.02)  # bf16, the LM head counted
    assert a100["kv_gb"] == pytest.approx(0.9 * 40 - weight_gb)
    per_request = 40 * 2 * 40 * 128 * 2 * (64 + 32)  # layers, K and V, heads, dim, bf16, tokens
    assert a100["requests_held"] == int(a100["kv_gb"] * 1e9 // per_request)
    assert a100["sustained"] > 0 and a100["devices"] == math.ceil(20 / a100["sustained"])
    assert a100["cost_per_million"] == pytest.approx(a100["devices"] * 3 / (20 * 32 * 3600) * 1e6)
    assert l4["devices"] is None and "no room" in l4["note"]  # 26 GB of weights, 24 GB of memory
    page = (tmp_path / "plan.html").read_text()
    assert "not a measurement" in page and "not a measurement" in record["caveat"]
    assert "not a measurement" in capsys.readouterr().out
    assert (tmp_path / "a100-40gb" / "vllm" / "floor" / "summary.json").is_file()
    probe = json.loads((tmp_path / "a100-40gb" / "vllm" / "floor" / "summary.json").read_text())
    assert "simulated" in probe["flag_codes"]
    assert probe["simulated"]["derived_from"]["hardware"]["name"] == "NVIDIA A100 40GB SXM"


def test_a_device_s_name_finds_its_preset() -> None:
    from servelab.harness.run.simulate.hardware import preset_of_device

    assert preset_of_device("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert preset_of_device("NVIDIA A100 80GB PCIe") == "a100-80gb"
    assert preset_of_device("NVIDIA H100 80GB HBM3") == "h100-80gb"
    assert preset_of_device("NVIDIA H200") == "h200"
    assert preset_of_device("NVIDIA L4") == "l4"
    assert preset_of_device("NVIDIA L40S") is None  # not an L4
    assert preset_of_device("AMD EPYC (2 threads)") is None


PLANNED = [
    "model=dummy-llama2-13b", "workload=random", "workload.num_requests=24",
    "workload.input_len.dist=fixed", "workload.input_len.value=64",
    "workload.output_len.value=32", "slo.ttft_s=2", "slo.tpot_s=0.1",
    "plan.strategies=[vllm]", "plan.rate=20", "plan.requests=48",
]  # fmt: skip


def _profile(tmp_path, measured_on: str, model: str = "dummy-llama2-13b"):
    """A step profile as `servelab profile-steps` writes one on a GPU (its seconds made up:
    no GPU here), of what the plan's vllm rows serve."""
    from dataclasses import replace

    from servelab.harness.run.compose import compose
    from servelab.harness.run.simulate.cost_model import StepCostModel
    from servelab.harness.run.simulate.engine import described_by
    from servelab.harness.run.spec import engine_spec

    cfg = compose([*PLANNED, f"model={model}", "engine.dtype=bf16", "strategy=vllm"])
    checked = engine_spec(cfg)
    described = {**described_by(checked.settings, checked.strategy, checked.model.name),
                 "device": "cuda"}  # fmt: skip
    per_unit = {"step": 0.012, "tokens": 2e-5, "context_tokens": 1e-8}
    model_file = tmp_path / f"profile-{len(measured_on)}-{model}.json"
    StepCostModel(per_unit, 1e-4, described).save(model_file)
    measured = replace(StepCostModel.load(model_file), measured_on=measured_on)
    measured.save(model_file)
    return model_file


def test_a_preset_s_measured_steps_time_its_rows_and_each_row_says_its_basis(
    tmp_path, capsys
) -> None:
    from servelab.commands.plan import main

    profile = _profile(tmp_path, "NVIDIA H100 80GB HBM3")
    out = tmp_path / "plan"
    main([*PLANNED, "plan.hardware=[h100-80gb,a100-80gb]",
          f"+plan.profiles.h100-80gb={profile}", f"plan.out_dir={out}"])  # fmt: skip
    h100, a100 = json.loads((out / "plan.json").read_text())["rows"]
    assert h100["basis"] == "measured: steps profiled on NVIDIA H100 80GB HBM3"
    assert a100["basis"].startswith("datasheet: NVIDIA A100 datasheet")
    assert h100["sustained"] > 0 and a100["sustained"] > 0
    floor = json.loads((out / "h100-80gb" / "vllm" / "floor" / "summary.json").read_text())
    assert floor["simulated"]["cost_model"] == str(profile)
    assert floor["simulated"]["measured_on"] == "NVIDIA H100 80GB HBM3"
    assert "measured: steps profiled on NVIDIA H100" in capsys.readouterr().out


def test_a_profile_of_another_gpu_or_model_is_refused_before_any_row(tmp_path) -> None:
    from servelab.base.errors import ConfigError
    from servelab.commands.plan import main

    out = tmp_path / "plan"
    cases = [
        (_profile(tmp_path, "NVIDIA A100-SXM4-80GB"), "was timed on 'NVIDIA A100-SXM4-80GB', "
         "not an NVIDIA H100 SXM 80GB"),
        (_profile(tmp_path, "NVIDIA H100 80GB HBM3", "dummy-llama3-8b"), "fitted on model "
         "'dummy-llama3-8b', but this run serves 'dummy-llama2-13b'"),
        (tmp_path / "missing.json", "cannot read"),
    ]  # fmt: skip
    for profile, message in cases:
        with pytest.raises(ConfigError, match=f"plan.profiles.h100-80gb: .*{message}"):
            main([*PLANNED, "plan.hardware=[h100-80gb]", f"+plan.profiles.h100-80gb={profile}",
                  f"plan.out_dir={out}"])  # fmt: skip
    assert not out.exists()  # refused before any simulated run
