"""Int4 weights: the group quantiser, the RTN format and its cache, and AWQ checkpoint folders
(ours and one written independently from the format's description) loading into the same
layers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.kernels.cpu_build import cpu_ops
from servelab.kernels.int4_layout import dequantize
from servelab.kernels.int4_matmul_triton import interpreted
from servelab.models.hf_folder import hf_config_dict, load_hf_folder, read_hf_config
from servelab.models.load import INIT_STD, build_model
from servelab.strategies.heads import HEADS
from servelab.strategies.weights.int4_checkpoint import RECORD_FILE
from servelab.strategies.weights.int4_format import LINEARS
from servelab.strategies.weights.int4_quant import fake_quantize, quantize
from servelab.strategies.weights.rtn import RtnWeights
from tests.awq_files import write_awq_folder
from tests.int4_cases import (
    CONFIG,
    CPU,
    all_logits,
    context,
    served_model,
    tiny_checkpoint,
    weights_format,
)

PROMPT = list(range(100, 140))


def test_quantize_rounds_each_weight_to_its_groups_nearest_level():
    weight = torch.randn(16, 200, generator=torch.Generator().manual_seed(0))
    quantized = quantize(weight, 64)  # groups 64, 64, 64 and a short last one of 8
    assert quantized.scales.shape == (16, 4) and quantized.zeros.shape == (16, 4)
    assert int(quantized.values.max()) <= 15 and int(quantized.zeros.max()) <= 15
    tail = weight[:, 192:]
    expected_tail = ((tail.amax(1) - tail.amin(1)) / 15).half().float()
    assert torch.equal(quantized.scales[:, 3], expected_tail)  # from its own 8 columns only
    step = quantized.scales.repeat_interleave(64, dim=1)[:, :200]
    error = (quantized.dequantize() - weight).abs()
    assert bool((error <= step * 0.5 + 1e-6).all())  # round to nearest (no clipping)


def test_fake_quantize_and_packing_give_the_served_weight():
    weight = torch.randn(24, 96, generator=torch.Generator().manual_seed(1))
    quantized = quantize(weight, 32)
    assert torch.equal(fake_quantize(weight, 32), quantized.dequantize())
    packed = quantized.packed()
    assert packed["qweight"].shape == (96, 3) and packed["scales"].dtype == torch.float16
    unpacked = dequantize(packed["qweight"], packed["qzeros"], packed["scales"], 32)
    assert torch.equal(unpacked, quantized.dequantize().t())


def test_clip_bound_limits_the_quantised_range():
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    bound = weight.abs().view(8, 2, 32).amax(-1) * 0.6
    quantized = quantize(weight, 32, bound)
    top = quantized.dequantize().view(8, 2, 32).abs().amax(-1)
    # the integer zero point shifts the grid by up to half a step
    assert bool((top <= bound + quantized.scales / 2 + 1e-6).all())
    assert bool((fake_quantize(weight, 32).view(8, 2, 32).abs().amax(-1) > top).all())


@pytest.mark.parametrize("group", [32, 128])  # 128 > hidden 64: one short group per row
def test_rtn_model_computes_with_its_dequantised_weights(tmp_path, group):
    checkpoint = tiny_checkpoint()
    weights = weights_format("int4-rtn", group_size=group)
    model = served_model(checkpoint, weights, context(tmp_path))
    config, state = checkpoint
    reference = dict(state)
    for layer in range(config.num_layers):
        for name in LINEARS:
            key = f"layers.{layer}.{name}.weight"
            reference[key] = fake_quantize(state[key], group)
    dense = build_model((config, reference), torch.float32, CPU)
    torch.testing.assert_close(all_logits(model, PROMPT), all_logits(dense, PROMPT))


def test_weight_bytes_count_the_packed_tensors(tmp_path):
    checkpoint = tiny_checkpoint()
    weights = weights_format("int4-rtn", group_size=32)
    model = served_model(checkpoint, weights, context(tmp_path))
    dense = build_model(checkpoint, torch.float32, CPU)
    linear_params = sum(i * o for i, o in _shapes().values()) * CONFIG.num_layers
    groups_out = sum(i // 32 * o for i, o in _shapes().values()) * CONFIG.num_layers
    packed = linear_params // 2 + groups_out // 8 * 4 + groups_out * 4  # values, zeros, fp32 scales
    expected = weights_format("dense").weight_bytes(dense) - linear_params * 4 + packed
    assert weights.weight_bytes(model) == expected


def _shapes() -> dict[str, tuple[int, int]]:
    h, inner, q, kv = 64, 128, 64, 32
    return {
        "q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h),
        "gate": (h, inner), "up": (h, inner), "down": (inner, h),
    }  # fmt: skip


def test_quantised_checkpoint_is_an_awq_folder_made_once(tmp_path, monkeypatch):
    checkpoint = tiny_checkpoint()
    weights = weights_format("int4-rtn", group_size=32)
    first = all_logits(served_model(checkpoint, weights, context(tmp_path)), PROMPT)
    folder = weights.folder
    assert folder is not None and folder.parent.parent == tmp_path
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 32,
        "zero_point": True,
        "version": "gemm",
    }
    assert read_hf_config(folder) == CONFIG
    record = json.loads((folder / RECORD_FILE).read_text())
    assert record["method"] == "rtn" and record["seconds"] > 0 and record["peak_rss_bytes"] > 0

    def refuse(*args):
        raise AssertionError("quantised again instead of reading the cache")

    monkeypatch.setattr(RtnWeights, "quantize", refuse)
    again = weights_format("int4-rtn", group_size=32)
    second = all_logits(served_model(checkpoint, again, context(tmp_path)), PROMPT)
    assert torch.equal(first, second)
    assert again.record()["folder"] == str(folder)


def _published_folder(tmp_path, group: int = 32):
    """An independently written AWQ folder for the tiny shape, and the dense model of the
    weights it stands for."""
    config, state = tiny_checkpoint(seed=3)
    hf_names = {
        ("model." + k)
        .replace("input_norm", "input_layernorm")
        .replace("post_attention_norm", "post_attention_layernorm"): v.numpy()
        for k, v in state.items()
    }
    folder = tmp_path / "published"
    served = write_awq_folder(folder, hf_config_dict(config), hf_names, group)
    dense_state = {}
    for hf, weight in served.items():
        ours = hf.removeprefix("model.").replace("input_layernorm", "input_norm")
        dense_state[ours.replace("post_attention_layernorm", "post_attention_norm")] = (
            torch.from_numpy(np.ascontiguousarray(weight))
        )
    return folder, build_model((config, dense_state), torch.float32, CPU)


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [("reference", torch.float32), ("triton", torch.float32), ("torch-packed", torch.bfloat16)],
)
def test_published_awq_checkpoint_loads_into_the_same_layers(tmp_path, kernel, dtype):
    if kernel == "triton" and not interpreted():
        pytest.skip("Triton compiles for CUDA tensors here; test_int4_kernels runs it on CUDA")
    folder, dense = _published_folder(tmp_path)
    weights = weights_format("int4-awq", group_size=32, int4_kernel=kernel)
    model = served_model(load_hf_folder(folder), weights, context(tmp_path, dtype))
    assert model.layers[0].mlp.up_proj.kernel.name == kernel
    got, expected = all_logits(model, PROMPT), all_logits(dense, PROMPT)
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    else:  # as close as the dense weights' own bfloat16 model (a wrong kernel is ~100% off)
        state = {k: v for k, v in dense.state_dict().items() if k != "lm_head.weight"}
        dense_bf16 = all_logits(build_model((CONFIG, state), dtype, CPU), PROMPT)
        bf16_error = float((dense_bf16 - expected).norm() / expected.norm())
        assert float((got - expected).norm() / expected.norm()) < 1.5 * bf16_error


def test_awq_checkpoints_are_refused_with_one_line_where_they_cannot_load(tmp_path):
    folder, _ = _published_folder(tmp_path)
    checkpoint = load_hf_folder(folder)
    with pytest.raises(ConfigError, match="strategy.weights.*int4-awq"):
        weights_format("dense").prepare(checkpoint, context(tmp_path))
    with pytest.raises(ConfigError, match="strategy.weights.*int4-awq, not int4-rtn"):
        weights_format("int4-rtn", group_size=32).prepare(checkpoint, context(tmp_path))
    with pytest.raises(ConfigError, match="strategy.group_size=32"):
        weights_format("int4-awq", group_size=64).prepare(checkpoint, context(tmp_path))
    pooled = HEADS.choose({"heads": "mqa"}).build().convert(checkpoint)
    with pytest.raises(ConfigError, match="strategy.heads"):
        weights_format("int4-awq", group_size=32).prepare(pooled, context(tmp_path))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "gptq"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="model.path.*'gptq'"):
        load_hf_folder(folder)


@pytest.mark.parametrize("method", ["int4-rtn", "int4-awq"])
def test_a_dummy_shape_draws_random_int4_weights_each_kernel_serves_alike(tmp_path, method):
    logits = []
    for kernel in ("reference", "cpu-panels") if cpu_ops() is not None else ("reference",):
        weights = weights_format(method, group_size=32, int4_kernel=kernel)
        model = served_model((CONFIG, None), weights, context(tmp_path))
        assert weights.record()["method"].startswith("random")
        logits.append(all_logits(model, PROMPT))
        if kernel == "reference":  # its operands are AutoAWQ's tensors
            q = model.layers[0].self_attn.q_proj
            weight = dequantize(q.qweight, q.qzeros, q.scales, 32)
            assert abs(float(weight.std()) / INIT_STD - 1) < 0.05
            assert abs(float(weight.mean())) < 5 * INIT_STD / weight.numel() ** 0.5
    torch.testing.assert_close(logits[-1], logits[0])
    assert not any(tmp_path.iterdir())  # nothing quantised, nothing cached
