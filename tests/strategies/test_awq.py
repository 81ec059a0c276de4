"""AWQ: calibration windows and statistics, the loss, folding, the scale and clip searches,
and the int4-awq format end to end on the tiny model (cache, record, engine)."""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.kernels.int4_layout import dequantize
from servelab.kernels.linear import packed_linear
from servelab.models.load import build_model
from servelab.strategies.weights.awq_search import (
    GroupChoice,
    _fold,
    output_error,
    scale_groups,
    search_clip,
    search_scales,
)
from servelab.strategies.weights.calibration import (
    InputStats,
    LayerRunner,
    calibration_windows,
    causal_attention,
)
from servelab.strategies.weights.int4_format import LINEARS
from servelab.strategies.weights.int4_quant import fake_quantize, grouped
from tests.conftest import CpuBuild
from tests.int4_cases import (
    CONFIG,
    CPU,
    all_logits,
    context,
    random_text,
    served_model,
    tiny_checkpoint,
    weights_format,
)
from tests.tiny import greedy_reference, make_engine, make_requests, random_prompts, serve, strategy

AWQ_KEYS = dict(group_size=32, calibration_samples=8, calibration_seq_len=64, awq_grid=10)


def stats_of(x: torch.Tensor) -> InputStats:
    return InputStats(x.abs().mean(0), x.t() @ x / x.shape[0], x.shape[0])


def test_calibration_windows_are_disjoint_and_spread_over_the_text():
    windows = calibration_windows(list(range(1000)), 4, 100)
    assert windows[:, 0].tolist() == [0, 300, 600, 900]
    assert torch.equal(windows[1], torch.arange(300, 400))
    with pytest.raises(ConfigError, match="strategy.calibration_samples.*has 1000"):
        calibration_windows(list(range(1000)), 11, 100)


def test_captured_statistics_are_those_of_the_layer_inputs():
    config, state = tiny_checkpoint()
    model = build_model((config, state), torch.float32, CPU)
    windows = calibration_windows(random_text().token_ids(), 4, 32)
    runner = LayerRunner(model, windows)
    layer = model.layers[0]
    x = model.embed_tokens(windows).reshape(-1, config.hidden_size)
    stats = runner.capture(layer)
    normed = layer.input_norm(x)
    torch.testing.assert_close(stats["qkv"].gram, normed.t() @ normed / normed.shape[0])
    torch.testing.assert_close(stats["qkv"].mean_abs, normed.abs().mean(0))
    positions = torch.arange(32).repeat(4)
    expected = layer(x, model.rotary(positions, x.dtype), None, None, None, causal_attention(32))
    torch.testing.assert_close(runner.hidden.reshape(-1, config.hidden_size), expected)


def test_gram_loss_is_the_output_error_on_the_inputs():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(500, 48, generator=generator)
    delta = torch.randn(16, 48, generator=generator)
    direct = ((x @ delta.t()) ** 2).sum() / 500
    assert output_error(delta, x.t() @ x / 500) == pytest.approx(float(direct), rel=1e-4)


def test_folding_scales_keeps_the_dense_layer_function():
    config, state = tiny_checkpoint()
    model = build_model((config, state), torch.float32, CPU)
    layer = model.layers[1]
    x = torch.randn(2 * 16, config.hidden_size, generator=torch.Generator().manual_seed(1))
    rope = model.rotary(torch.arange(16).repeat(2), x.dtype)
    before = layer(x, rope, None, None, None, causal_attention(16))
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for group in scale_groups(layer):  # o's scales live on v's 32 channels, tied per head
            width = layer.get_submodule(group.linears[0]).in_features
            channels = group.pool(torch.ones(width)).shape[0]
            _fold(layer, group, torch.rand(channels, generator=generator) * 3 + 0.2)
    after = layer(x, rope, None, None, None, causal_attention(16))
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)


def test_scale_search_protects_a_salient_input_channel():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2000, 64, generator=generator)
    x[:, 5] *= 40  # one channel carries most of the activation magnitude
    weight = torch.randn(32, 64, generator=generator)
    group = scale_groups(build_model(tiny_checkpoint(), torch.float32, CPU).layers[0])[0]
    scales, choice = search_scales([weight], stats_of(x), group, 32, 20)
    assert isinstance(choice, GroupChoice)
    assert choice.alpha > 0 and choice.loss < 0.8 * choice.rtn_loss
    assert int(scales.argmax()) == 5  # the salient channel is scaled up the most
    served = fake_quantize(weight * scales, 32) / scales  # the loss is that weight's error
    assert output_error(served - weight, stats_of(x).gram) == pytest.approx(choice.loss)


def test_clip_search_never_does_worse_than_no_clipping():
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(1000, 80, generator=generator)
    weight = torch.randn(24, 80, generator=generator)
    weight[0, 3] = 8.0  # an outlier weight: clipping its group should pay
    gram = x.t() @ x / 1000
    bound = search_clip(weight, gram, 32)  # groups of 32, 32 and a short one of 16
    assert bound.shape == (24, 3)

    def group_errors(clip: torch.Tensor | None) -> torch.Tensor:
        delta = fake_quantize(weight, 32, clip) - weight
        blocks = [gram[g * 32 : (g + 1) * 32, g * 32 : (g + 1) * 32] for g in range(3)]
        parts = grouped(delta, 32)
        return torch.stack(
            [((parts[:, g, : b.shape[0]] @ b) * parts[:, g, : b.shape[0]]).sum(-1)
             for g, b in enumerate(blocks)],
            dim=1,
        )  # fmt: skip

    clipped, unclipped = group_errors(bound), group_errors(None)
    assert bool((clipped <= unclipped + 1e-6).all())
    assert float(clipped[0, 0]) < float(unclipped[0, 0])


def test_awq_beats_rtn_where_a_channel_is_salient(tmp_path):
    checkpoint = tiny_checkpoint(seed=5, salient=7)
    calibration = random_text(seed=6)
    dense = build_model(checkpoint, torch.float32, CPU)
    awq = served_model(
        checkpoint,
        weights_format("int4-awq", **AWQ_KEYS),
        context(tmp_path, calibration=calibration),
    )
    rtn = served_model(checkpoint, weights_format("int4-rtn", group_size=32), context(tmp_path))
    held_out = random_text(count=200, seed=7).token_ids()  # not the calibration tokens
    expected = all_logits(dense, held_out)

    def error(model) -> float:
        return float(((all_logits(model, held_out) - expected) ** 2).mean())

    assert error(awq) < 0.8 * error(rtn)


def test_awq_record_and_cache(tmp_path):
    checkpoint = tiny_checkpoint()
    weights = weights_format("int4-awq", **AWQ_KEYS)
    served_model(checkpoint, weights, context(tmp_path, calibration=random_text()))
    record = weights.record()
    assert record["calibration"]["samples"] == 8 and record["calibration"]["tokens"] == 8 * 64
    assert record["grid"] == 10 and record["clip"] is True and record["group_size"] == 32
    assert len(record["layers"]) == CONFIG.num_layers
    for layer in record["layers"]:
        for choice in layer.values():
            assert choice["loss"] <= choice["rtn_loss"]
    assert record["seconds"] > 0 and record["peak_rss_bytes"] > 0
    other = weights_format("int4-awq", **{**AWQ_KEYS, "calibration_samples": 4})
    served_model(checkpoint, other, context(tmp_path, calibration=random_text()))
    assert other.folder != weights.folder  # other settings, another checkpoint
    with pytest.raises(ConfigError, match="calibration_samples"):
        too_many = weights_format("int4-awq", **{**AWQ_KEYS, "calibration_samples": 100})
        too_many.prepare(checkpoint, context(tmp_path / "b", calibration=random_text()))


def test_awq_model_serves_its_own_greedy_tokens_in_the_engine(tmp_path):
    weights = weights_format("int4-awq", **AWQ_KEYS)
    model = served_model(tiny_checkpoint(), weights, context(tmp_path, calibration=random_text()))
    prompts = random_prompts(4, 5, 20, seed=8)
    requests = make_requests(prompts, [6, 9, 4, 7])
    serve(make_engine(model, strategy("iteration", "paged", prefix_caching=True), 256), requests)
    for request, prompt in zip(requests, prompts, strict=True):
        assert request.output_ids == greedy_reference(model, prompt, len(request.output_ids))


def test_awq_in_fp32_serves_the_greedy_tokens_of_its_dequantised_weights(
    tmp_path, cpu_build: CpuBuild
) -> None:
    """At each level this CPU runs (the portable ones too), the int4-awq model served in fp32
    gives the tokens of a dense model holding its dequantised weights, and its logits bit for
    bit: both multiply on the same fp32 panels, the int4 layers dequantising theirs exactly."""
    weights = weights_format("int4-awq", int4_kernel="auto", **AWQ_KEYS)
    ctx = context(tmp_path, calibration=random_text())
    config, state = weights.prepare(tiny_checkpoint(), ctx)
    int4 = build_model((config, state), torch.float32, CPU, weights.linear)
    dense_state = {
        name: tensor
        for name, tensor in state.items()
        if not name.endswith((".qweight", ".qzeros", ".scales"))
    }
    for layer in range(config.num_layers):
        for name in LINEARS:
            prefix = f"layers.{layer}.{name}"
            parts = (state[f"{prefix}.{part}"] for part in ("qweight", "qzeros", "scales"))
            dense_state[f"{prefix}.weight"] = dequantize(*parts, AWQ_KEYS["group_size"]).t()
    dense = build_model((config, dense_state), torch.float32, CPU, packed_linear)
    prompts = random_prompts(4, 5, 20, seed=8)
    served = []
    for model in (int4, dense):
        requests = make_requests(prompts, [6, 9, 4, 7])
        serve(
            make_engine(model, strategy("iteration", "paged", prefix_caching=True), 256), requests
        )
        served.append([request.output_ids for request in requests])
    assert served[0] == served[1]
    assert torch.equal(all_logits(int4, prompts[0]), all_logits(dense, prompts[0]))
