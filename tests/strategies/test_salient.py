"""Salient channels kept in round-to-nearest int4: which channels each choice keeps, and the
two ends (all kept is the dense weight, none kept is RTN's served weight), on synthetic
layers and the tiny model."""

from __future__ import annotations

import pytest
import torch

from servelab.base.errors import ConfigError
from servelab.commands.salient import parse_args
from servelab.strategies.weights.int4_format import LINEARS
from servelab.strategies.weights.int4_quant import quantize
from servelab.strategies.weights.salient import (
    activation_magnitudes,
    at_random,
    by_activation,
    by_weight,
    kept_count,
    linear_weights,
    no_channels,
    quantize_keeping,
    serve_keeping,
    top_channels,
)
from tests.tiny import tiny_model

GROUP = 32


def synthetic_weight(seed: int = 0, out_features: int = 24, in_features: int = 200) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(seed))


def test_activation_choice_keeps_the_top_channels_by_mean_input_magnitude():
    weight = synthetic_weight()
    magnitude = torch.rand(200, generator=torch.Generator().manual_seed(1))
    planted = [3, 77, 150, 199]
    magnitude[planted] = torch.tensor([9.0, 7.0, 8.0, 6.0])
    choose = by_activation([{"mlp.down_proj": magnitude}], 0.02)  # 4 of 200
    assert choose(0, "mlp.down_proj", weight).tolist() == planted
    wider = by_activation([{"mlp.down_proj": magnitude}], 0.1)(0, "mlp.down_proj", weight)
    assert wider.tolist() == sorted(torch.argsort(magnitude, descending=True)[:20].tolist())


def test_weight_choice_keeps_the_top_channels_by_column_norm():
    weight = synthetic_weight()
    planted = [0, 42, 100]
    weight[:, planted] *= torch.tensor([5.0, 4.0, 6.0])
    choose = by_weight(0.015)  # 3 of 200
    assert choose(0, "self_attn.q_proj", weight).tolist() == planted
    norms = (weight**2).sum(0).sqrt()
    wider = by_weight(0.1)(0, "self_attn.q_proj", weight)
    assert wider.tolist() == sorted(torch.argsort(norms, descending=True)[:20].tolist())


def test_kept_count_rounds_the_share_of_input_channels():
    assert [kept_count(576, 0.01), kept_count(1536, 0.01), kept_count(64, 0.01)] == [6, 15, 1]
    assert kept_count(200, 1.0) == 200
    assert top_channels(torch.arange(5.0), 0).numel() == 0


def test_random_choice_is_reproducible_by_seed():
    weights = [synthetic_weight(seed, in_features=300) for seed in range(4)]

    def draws(seed: int) -> list[list[int]]:
        choose = at_random(0.05, seed)
        return [choose(i, "mlp.up_proj", w).tolist() for i, w in enumerate(weights)]

    first = draws(7)
    assert first == draws(7)
    assert first != draws(8)
    assert all(len(kept) == 15 and len(set(kept)) == 15 for kept in first)
    assert first[0] != first[1]  # one generator across the model, not one draw repeated


def test_all_channels_kept_is_the_dense_weight_exactly():
    weight = synthetic_weight()
    kept = by_weight(1.0)(0, "mlp.up_proj", weight)
    assert torch.equal(quantize_keeping(weight, kept, GROUP), weight)


def test_no_channel_kept_is_round_to_nearest_exactly():
    weight = synthetic_weight()  # 200 inputs: a short last group too
    served = quantize_keeping(weight, no_channels(0, "mlp.up_proj", weight), GROUP)
    assert torch.equal(served, quantize(weight, GROUP).dequantize())


def test_kept_columns_are_dense_and_the_rest_are_rtn():
    weight = synthetic_weight()
    kept = torch.tensor([5, 60, 61])
    served = quantize_keeping(weight, kept, GROUP)
    rtn = quantize(weight, GROUP).dequantize()
    others = torch.ones(200, dtype=torch.bool)
    others[kept] = False
    assert torch.equal(served[:, kept], weight[:, kept])
    assert torch.equal(served[:, others], rtn[:, others])


def test_serving_a_model_at_either_end_gives_dense_and_rtn_layers():
    model = tiny_model(scale=0.1)
    dense = linear_weights(model)
    kept, total = serve_keeping(model, dense, by_weight(1.0), GROUP)
    assert kept == total == sum(int(w.shape[1]) for w in dense.values())
    for (index, name), weight in dense.items():
        assert torch.equal(model.layers[index].get_submodule(name).weight, weight)
    assert serve_keeping(model, dense, no_channels, GROUP)[0] == 0
    for (index, name), weight in dense.items():
        expected = quantize(weight, GROUP).dequantize()
        assert torch.equal(model.layers[index].get_submodule(name).weight, expected)


def test_activation_statistics_cover_every_linear_input():
    model = tiny_model(scale=0.1)
    windows = torch.randint(17, 1000, (2, 16), generator=torch.Generator().manual_seed(0))
    magnitudes = activation_magnitudes(model, windows, progress=False)
    assert len(magnitudes) == model.config.num_layers
    for index, layer in enumerate(model.layers):
        assert set(magnitudes[index]) == set(LINEARS)
        for name in LINEARS:
            assert magnitudes[index][name].shape == (layer.get_submodule(name).in_features,)
        q, k, v = (magnitudes[index][f"self_attn.{p}_proj"] for p in "qkv")
        assert torch.equal(q, k) and torch.equal(q, v)  # one input, one statistic


@pytest.mark.parametrize("bad", ["fraction=0", "fraction=1.5", "seed=-1", "windows=0"])
def test_bad_arguments_fail_with_the_field_named(bad: str):
    with pytest.raises(ConfigError, match=f"salient.{bad.partition('=')[0]}"):
        parse_args([bad])


def test_arguments_split_from_overrides():
    args, rest = parse_args(["fraction=0.03", "seed=4", "model=dummy-tiny", "out=x.json"])
    assert (args.fraction, args.seed, args.windows, args.out) == (0.03, 4, 16, "x.json")
    assert rest == ["model=dummy-tiny"]
