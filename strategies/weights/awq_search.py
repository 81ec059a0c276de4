"""AWQ's search for one decoder layer: per-channel scales, then clipping, then int4 values.

For each group of linears that share an input (q/k/v after the attention norm; o after v;
gate/up after the MLP norm; down after up), the candidate scales are `s = s_x^alpha`,
normalised by `sqrt(max(s) min(s))`, for `alpha` on a grid over [0, 1): `s_x` is the
input's per-channel mean magnitude, so channels with large activations (the salient ones)
are scaled up before quantisation and their relative rounding error shrinks. A candidate's
loss is the error of the group's output on the calibration inputs,
`sum ||X diag(1/s) Q(W diag(s)) - X W||^2` over the group's linears (the objective of the
AWQ paper), computed exactly from the input's Gram matrix. The best `s` is folded in exactly:
`W diag(s)` in the group's linears and `1/s` into the op before them (the norm weight, or
the rows of v or up). `alpha = 0` is plain round-to-nearest, so the kept scales never do
worse than RTN on the calibration text.

o after v: with grouped-query attention one value channel feeds the same channel of every
query head in its group, so o's input scales are tied within each group and the search runs
over v's channels (with as many KV heads as query heads this is the plain case).

Then, per linear except q and k (their error passes through the attention softmax, which a
linear loss does not see; AutoAWQ skips them too), the clipping search: for each (output
channel, group), the bound `r * max|w|` for `r` in 1, 0.95, ..., 0.55 that minimises that
group's share of the output error, `dw G_gg dw^T`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from servelab.models.model import DecoderLayer
from servelab.strategies.weights.calibration import InputStats
from servelab.strategies.weights.int4_quant import QuantizedWeight, fake_quantize, grouped, quantize

CLIP_GRID = 20
CLIP_MAX_SHRINK = 0.5
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")


@dataclass
class ScaleGroup:
    """Linears sharing an input, the op before them that absorbs 1/s, and how the searched
    scale vector (in that op's output channels) maps onto the linears' input channels."""

    name: str
    linears: tuple[str, ...]
    fold_into: str  # a norm (its weight) or a linear (its rows)
    expand: Callable[[torch.Tensor], torch.Tensor]
    pool: Callable[[torch.Tensor], torch.Tensor]


@dataclass
class GroupChoice:
    """What the scale search kept for one group, for the calibration record."""

    alpha: float
    loss: float  # output error with the kept scales
    rtn_loss: float  # output error at alpha = 0 (round to nearest)


def _same(vector: torch.Tensor) -> torch.Tensor:
    return vector


def scale_groups(layer: DecoderLayer) -> list[ScaleGroup]:
    """The four groups of a Llama decoder layer, in search order."""
    attention = layer.self_attn
    query_heads, kv_heads, dim = attention.num_heads, attention.num_kv_heads, attention.head_dim
    per_kv = query_heads // kv_heads

    def expand_v(scales: torch.Tensor) -> torch.Tensor:  # [kv * D] -> [q * D]
        return scales.view(kv_heads, 1, dim).expand(kv_heads, per_kv, dim).reshape(-1)

    def pool_v(values: torch.Tensor) -> torch.Tensor:  # [q * D] -> [kv * D]
        return values.view(kv_heads, per_kv, dim).mean(dim=1).reshape(-1)

    return [
        ScaleGroup(
            "qkv",
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
            "input_norm",
            _same,
            _same,
        ),
        ScaleGroup("o", ("self_attn.o_proj",), "self_attn.v_proj", expand_v, pool_v),
        ScaleGroup(
            "gate_up", ("mlp.gate_proj", "mlp.up_proj"), "post_attention_norm", _same, _same
        ),
        ScaleGroup("down", ("mlp.down_proj",), "mlp.up_proj", _same, _same),
    ]


def output_error(delta: torch.Tensor, gram: torch.Tensor) -> float:
    """`sum ||X delta^T||^2 / N` for a weight error `delta` `[out, in]`, from `G = X^T X / N`."""
    return float(((delta @ gram) * delta).sum())


def search_scales(
    weights: list[torch.Tensor],
    stats: InputStats,
    group: ScaleGroup,
    group_size: int,
    grid: int,
) -> tuple[torch.Tensor, GroupChoice]:
    """The best scales (in the fold target's channels) for `weights` `[out, in]` sharing an
    input, and what they achieved."""
    magnitude = group.pool(stats.mean_abs)
    weight = torch.cat(weights)  # rows quantise independently: one matrix for the group
    best: tuple[float, float, torch.Tensor] | None = None
    rtn_loss = math.nan
    for step in range(grid):
        alpha = step / grid
        scales = magnitude.pow(alpha).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        on_inputs = group.expand(scales)
        served = fake_quantize(weight * on_inputs, group_size) / on_inputs
        loss = output_error(served - weight, stats.gram)
        if step == 0:
            rtn_loss = loss
        if best is None or loss < best[0]:
            best = (loss, alpha, scales)
    assert best is not None
    loss, alpha, scales = best
    return scales, GroupChoice(alpha, loss, rtn_loss)


def search_clip(weight: torch.Tensor, gram: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per (output channel, group) clip bound `[out, groups]` minimising each group's error."""
    groups = grouped(weight, group_size)
    count = groups.shape[1]
    padded = count * group_size
    full = torch.zeros(padded, padded, dtype=gram.dtype, device=gram.device)
    full[: gram.shape[0], : gram.shape[1]] = gram
    blocks = torch.stack(
        [
            full[g * group_size : (g + 1) * group_size, g * group_size : (g + 1) * group_size]
            for g in range(count)
        ]
    )  # [groups, gs, gs]; zero where a short last group is padded
    absmax = groups.abs().amax(dim=-1)
    best_bound = absmax.clone()
    best_error = torch.full_like(absmax, math.inf)
    for step in range(int(CLIP_GRID * CLIP_MAX_SHRINK)):
        bound = absmax * (1 - step / CLIP_GRID)
        delta = grouped(fake_quantize(weight, group_size, bound), group_size) - groups
        error = torch.einsum("ogi,gij,ogj->og", delta, blocks, delta)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_bound = torch.where(better, bound, best_bound)
    return best_bound


def _fold(layer: DecoderLayer, group: ScaleGroup, scales: torch.Tensor) -> None:
    """Multiply the group's linears' input columns by `s` and divide the op before by `s`."""
    on_inputs = group.expand(scales)
    for name in group.linears:
        layer.get_submodule(name).weight.mul_(on_inputs)
    target = layer.get_submodule(group.fold_into)
    if isinstance(target, torch.nn.Linear):
        target.weight.div_(scales.unsqueeze(1))  # its output rows
    else:
        target.weight.div_(scales)


@torch.no_grad()
def awq_layer(
    layer: DecoderLayer,
    stats: dict[str, InputStats],
    group_size: int,
    grid: int,
    clip: bool,
) -> tuple[dict[str, QuantizedWeight], dict[str, GroupChoice]]:
    """Search, fold and quantise one layer in place (its norms and v/up rows change); returns
    each linear's int4 weight and each group's choice."""
    choices: dict[str, GroupChoice] = {}
    input_scales: dict[str, torch.Tensor] = {}
    for group in scale_groups(layer):
        weights = [layer.get_submodule(name).weight.float() for name in group.linears]
        scales, choices[group.name] = search_scales(
            weights, stats[group.name], group, group_size, grid
        )
        _fold(layer, group, scales)
        for name in group.linears:
            input_scales[name] = group.expand(scales)
    quantized = {}
    for group in scale_groups(layer):
        on_inputs = input_scales[group.linears[0]]
        gram = stats[group.name].gram / torch.outer(on_inputs, on_inputs)  # of X diag(1/s)
        for name in group.linears:
            weight = layer.get_submodule(name).weight.float()
            bound = search_clip(weight, gram, group_size) if clip and name not in NO_CLIP else None
            quantized[name] = quantize(weight, group_size, bound)
    return quantized, choices
