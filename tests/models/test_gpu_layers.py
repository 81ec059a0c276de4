"""The fused GPU layers (`models/gpu_layers.py`) serve the same tokens as the layer modules,
on the Triton attention (interpreted on a CPU), for prefill, chunked and decode steps, paged
and contiguous; where they cannot apply the modules run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from servelab.engine.kv_cache import KVLayout
from servelab.harness.run.build import build_engine, random_model
from servelab.kernels.attention import Attention, AttentionConfig
from servelab.kernels.linear import PackedLinear, packed_linear
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.gpu_layers import GpuLayers, gpu_layers
from servelab.models.load import build_model
from tests import tiny

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def served(fused: bool, kv: str, chunked: bool, weights: str = "dense") -> tuple[list, bool]:
    if weights == "dense":
        model = tiny.tiny_model(seed=3).to(DEVICE)
    else:  # random int4 weights, multiplied by the Triton kernels (interpreted on a CPU)
        settings = tiny.strategy(weights=weights, group_size=32, int4_kernel="triton").weights
        model = random_model(DUMMY_SHAPES["tiny"], settings, torch.float32, DEVICE)
    config = model.config
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, torch.float32)
    settings = replace(
        tiny.engine_settings(400 * layout.bytes_per_token, 4, 24, attention="triton"),
        device=DEVICE, fused_decode=fused,
    )  # fmt: skip
    batching = tiny.strategy("iteration", kv, chunked_prefill=chunked)
    engine = build_engine(model, settings, batching, lambda: 0.0)
    requests = tiny.make_requests(tiny.random_prompts(6, 3, 30, seed=5), [12, 5, 9, 16, 7, 11])
    tiny.serve(engine, requests)
    return [r.output_ids for r in requests], isinstance(model.layer_runner, GpuLayers)


@pytest.mark.parametrize("kv", ["paged", "contiguous"])
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_the_fused_layers_serve_the_modules_tokens(kv: str, chunked: bool) -> None:
    fused, used = served(True, kv, chunked)
    plain, unused = served(False, kv, chunked)
    assert used and not unused
    assert fused == plain


def test_the_fused_layers_serve_the_int4_modules_tokens() -> None:
    # q, k, v and gate, up joined as AutoAWQ's packed tensors side by side
    fused, used = served(True, "paged", True, "int4-rtn")
    plain, unused = served(False, "paged", True, "int4-rtn")
    assert used and not unused
    assert fused == plain and len(set(map(tuple, fused))) > 1  # not one repeated token


def test_the_modules_run_where_the_fused_layers_cannot() -> None:
    model = tiny.tiny_model()
    assert gpu_layers(model, Attention(AttentionConfig("torch"), DEVICE)) is None
    model.layers[0].self_attn.kv_repeat = 2  # the mha layout stores every KV head twice
    assert gpu_layers(model, Attention(AttentionConfig("triton"), DEVICE)) is None


def test_the_fused_layers_take_the_layers_a_dense_run_builds() -> None:
    # a run's dense linears are the dense format's `PackedLinear`s (their packed copies serve
    # CPU forwards only), not plain `nn.Linear`s
    model = build_model((DUMMY_SHAPES["tiny"], None), torch.float32, DEVICE, packed_linear)
    assert isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    assert isinstance(gpu_layers(model, Attention(AttentionConfig("triton"), DEVICE)), GpuLayers)


def test_the_concatenated_weights_are_the_modules_own_memory() -> None:
    model = tiny.tiny_model()
    attn = model.layers[0].self_attn
    q_before = attn.q_proj.weight.clone()
    assert gpu_layers(model, Attention(AttentionConfig("triton"), DEVICE)) is not None
    storage = attn.q_proj.weight.untyped_storage().data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == storage
    assert torch.equal(attn.q_proj.weight, q_before)


def test_the_joined_int4_tensors_are_the_modules_own_memory() -> None:
    settings = tiny.strategy(weights="int4-rtn", group_size=32, int4_kernel="reference").weights
    model = random_model(DUMMY_SHAPES["tiny"], settings, torch.float32, torch.device("cpu"))
    mlp = model.layers[1].mlp
    x = torch.randn(3, model.config.hidden_size)
    before = mlp.gate_proj(x), mlp.up_proj(x)
    runner = gpu_layers(model, Attention(AttentionConfig("triton"), torch.device("cpu")))
    assert runner is not None
    for name in ("qweight", "qzeros", "scales"):
        gate, up = mlp.gate_proj.get_buffer(name), mlp.up_proj.get_buffer(name)
        assert gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr()
    torch.testing.assert_close(runner.layers[1].gate_up(x), torch.cat(before, dim=1))
    assert torch.equal(before[0], mlp.gate_proj(x)) and torch.equal(before[1], mlp.up_proj(x))
