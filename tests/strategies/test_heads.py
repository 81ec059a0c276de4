"""Head layouts: conversions are the stated arithmetic; `mha` is `gqa` with a bigger cache."""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.engine.kv_cache import KVLayout
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.model import LlamaModel
from servelab.strategies.heads import HEADS
from tests.tiny import make_engine, make_requests, random_prompts, serve, strategy, tiny_model


def layout(name: str):
    return HEADS.choose({"heads": name}).build()


def _stored_bytes(name: str) -> int:
    config = DUMMY_SHAPES["smollm2-135m"]
    heads = layout(name).stored_kv_heads(config)
    return KVLayout(config.num_layers, heads, config.head_dim, torch.bfloat16).bytes_per_token


def test_kv_bytes_per_token_on_the_real_shape_are_3_to_1_to_a_third() -> None:
    assert _stored_bytes("gqa") == 2 * 30 * 3 * 64 * 2 == 23040
    assert _stored_bytes("mha") == 3 * _stored_bytes("gqa")
    assert _stored_bytes("mqa") * 3 == _stored_bytes("gqa")


def test_mqa_conversion_mean_pools_key_and_value_heads() -> None:
    config = DUMMY_SHAPES["tiny"]  # 4 query heads, 2 KV heads of 16 dims
    state = {name: torch.randn(t.shape) for name, t in LlamaModel(config).state_dict().items()}
    converted, pooled = layout("mqa").convert((config, state))
    assert converted.num_kv_heads == 1
    for kind in ("k_proj", "v_proj"):
        original = state[f"layers.0.self_attn.{kind}.weight"]
        expected = (original[:16] + original[16:]) / 2
        assert torch.allclose(pooled[f"layers.0.self_attn.{kind}.weight"], expected)
    assert torch.equal(
        pooled["layers.0.self_attn.q_proj.weight"], state["layers.0.self_attn.q_proj.weight"]
    )


def test_head_counts_that_do_not_divide_are_rejected() -> None:
    with pytest.raises(ConfigError, match="strategy.heads"):
        layout("gqa-3").stored_kv_heads(DUMMY_SHAPES["tiny"])
    with pytest.raises(ConfigError, match="strategy.heads"):
        layout("groups")


def test_mha_layout_serves_the_same_tokens_as_gqa() -> None:
    prompts = random_prompts(4, 3, 20, seed=5)
    outputs = {}
    for name in ("gqa", "mha"):
        model = tiny_model()
        layout(name).apply(model)
        requests = make_requests(prompts, [6, 3, 8, 5])
        serve(make_engine(model, strategy("iteration", heads=name), kv_slots=300), requests)
        outputs[name] = [r.output_ids for r in requests]
        assert model.kv_heads_stored == (4 if name == "mha" else 2)
    assert outputs["mha"] == outputs["gqa"]
