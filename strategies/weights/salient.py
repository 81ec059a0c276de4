"""Round-to-nearest int4 with a few input channels kept in full precision: AWQ's first experiment.

The AWQ paper (Lin et al., MLSys 2024, section 2.1) motivates its method by keeping about 1%
of each linear's input channels at full precision inside round-to-nearest int4 weights: chosen
by the magnitude of the activations they multiply, that small share removes most of the
quantisation error; chosen by the weights' own magnitude, or at random, it does little. This
module makes those weights for one model so that their quality can be measured.

Each linear's weight is quantised exactly as `int4-rtn` quantises it (`fake_quantize`:
groups of `group_size` inputs, asymmetric, float16 scales), then the chosen input columns are
put back at full precision. The groups' ranges are round-to-nearest's own (a kept column still
counts in its group's minimum and maximum), so a variant differs from plain RTN in its kept
columns alone: with none kept it is RTN, with all kept it is the dense weight.

Per linear, `round(fraction * in_features)` input channels are kept, the top ones by
- `activation`: the mean |x| of the linear's input per channel over the calibration windows,
  the statistic AWQ's own search starts from (`strategies.weights.calibration`), taken from
  the dense model layer by layer;
- `weight`: the L2 norm of the weight's input column;
- `random`: drawn from one generator seeded once, linear after linear in model order, so that
  a seed always gives the same channels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm import tqdm

from servelab.models.model import LlamaModel
from servelab.strategies.weights.awq_search import scale_groups
from servelab.strategies.weights.calibration import LayerRunner
from servelab.strategies.weights.int4_format import LINEARS
from servelab.strategies.weights.int4_quant import fake_quantize

SELECTIONS = ("activation", "weight", "random")

LinearWeights = dict[tuple[int, str], torch.Tensor]  # (layer, linear name) -> weight [out, in]
Magnitudes = list[dict[str, torch.Tensor]]  # per layer, linear name -> mean |x| per input
Choose = Callable[[int, str, torch.Tensor], torch.Tensor]  # (layer, name, weight) -> channels


def kept_count(in_features: int, fraction: float) -> int:
    """Input channels kept of a linear with `in_features` inputs."""
    return round(fraction * in_features)


def top_channels(statistic: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` channels with the largest `statistic`, in ascending channel order."""
    return torch.topk(statistic, count).indices.sort().values


def weight_norms(weight: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each input column of `weight` `[out, in]`."""
    return weight.float().norm(dim=0)


def quantize_keeping(weight: torch.Tensor, kept: torch.Tensor, group_size: int) -> torch.Tensor:
    """`weight` `[out, in]` as round-to-nearest int4 serves it, except the input columns
    `kept`, which keep their full-precision values; float32."""
    served = fake_quantize(weight, group_size)
    served[:, kept] = weight[:, kept].float()
    return served


def no_channels(layer: int, name: str, weight: torch.Tensor) -> torch.Tensor:
    """Nothing kept: plain round-to-nearest."""
    del layer, name
    return torch.empty(0, dtype=torch.int64, device=weight.device)


def by_activation(magnitudes: Magnitudes, fraction: float) -> Choose:
    def choose(layer: int, name: str, weight: torch.Tensor) -> torch.Tensor:
        return top_channels(magnitudes[layer][name], kept_count(weight.shape[1], fraction))

    return choose


def by_weight(fraction: float) -> Choose:
    def choose(layer: int, name: str, weight: torch.Tensor) -> torch.Tensor:
        del layer, name
        return top_channels(weight_norms(weight), kept_count(weight.shape[1], fraction))

    return choose


def at_random(fraction: float, seed: int) -> Choose:
    generator = torch.Generator().manual_seed(seed)

    def choose(layer: int, name: str, weight: torch.Tensor) -> torch.Tensor:
        del layer, name
        inputs = weight.shape[1]
        drawn = torch.randperm(inputs, generator=generator)[: kept_count(inputs, fraction)]
        return drawn.sort().values.to(weight.device)

    return choose


def chooser(selection: str, fraction: float, seed: int, magnitudes: Magnitudes) -> Choose:
    """The channel choice `selection` names (one of `SELECTIONS`)."""
    if selection == "activation":
        return by_activation(magnitudes, fraction)
    if selection == "weight":
        return by_weight(fraction)
    if selection == "random":
        return at_random(fraction, seed)
    raise ValueError(f"unknown selection {selection!r}; use one of {', '.join(SELECTIONS)}")


def linear_inputs(model: LlamaModel) -> dict[str, str]:
    """Each linear's name -> the calibration group whose input it reads (q/k/v share one)."""
    return {name: group.name for group in scale_groups(model.layers[0]) for name in group.linears}


def activation_magnitudes(
    model: LlamaModel, windows: torch.Tensor, progress: bool = True
) -> Magnitudes:
    """Per layer, each linear's mean input magnitude per channel over the calibration windows,
    with the dense `model` run one layer at a time (AWQ's calibration pass)."""
    runner = LayerRunner(model, windows)
    groups = linear_inputs(model)
    layers = tqdm(model.layers, desc="salient: activation statistics", disable=not progress)
    magnitudes: Magnitudes = []
    for layer in layers:
        stats = runner.capture(layer)
        magnitudes.append({name: stats[group].mean_abs for name, group in groups.items()})
    return magnitudes


def linear_weights(model: LlamaModel) -> LinearWeights:
    """A copy of every decoder linear's weight."""
    return {
        (index, name): layer.get_submodule(name).weight.detach().clone()
        for index, layer in enumerate(model.layers)
        for name in LINEARS
    }


@torch.no_grad()
def serve_keeping(
    model: LlamaModel, dense: LinearWeights, choose: Choose, group_size: int
) -> tuple[int, int]:
    """Set every decoder linear of `model` to its `dense` weight quantised with the channels
    `choose` picks kept; (input channels kept, input channels in all) over the model."""
    kept_total, inputs_total = 0, 0
    for (index, name), weight in dense.items():
        kept = choose(index, name, weight)
        served = quantize_keeping(weight, kept, group_size)
        model.layers[index].get_submodule(name).weight.copy_(served)
        kept_total += int(kept.numel())
        inputs_total += int(weight.shape[1])
    return kept_total, inputs_total
