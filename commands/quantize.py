"""`servelab quantize method=awq|rtn`: make the int4 checkpoint and measure what it costs.

Quantises the configured model with `strategy.weights=int4-METHOD` (AWQ calibrates on the
calibration text, layer by layer, with a progress bar) into the cache, unless that
checkpoint is already there; then, in float32 (quality is judged in float32), scores the
quantised and the dense weights on the same windows of held-out text and serves the
configured workload's prompts greedily with both, counting the requests whose outputs are
identical, and the share of held-out positions where both predict the same next token. The
figures go into the weights' quality record, where runs and reports find them; the table
printed says where the checkpoint and its calibration record are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.base.errors import ConfigError
from servelab.commands.config import take_counts
from servelab.harness.measure.perplexity import window_logits
from servelab.harness.measure.weights_quality import perplexity_entry, quality_path, record_quality
from servelab.harness.run.compose import compose, serving_weights
from servelab.harness.run.offline import Served, serve_outputs
from servelab.harness.run.settings import cache_dir_of
from servelab.harness.run.spec import run_spec
from servelab.workloads.text import text_section

METHODS = ("awq", "rtn")
SUMMARY = "make the int4 (AWQ or RTN) checkpoint; record its perplexity and greedy agreement"
USAGE = """usage: servelab quantize method=awq|rtn [windows=N] [OVERRIDE ...]

Quantises the model's linear layers to int4 (strategy.group_size, and for awq
strategy.calibration_samples, calibration_seq_len, awq_grid, awq_clip) into the cache
(once), then in fp32 scores N windows of 512 tokens of held-out text (default 16) with the
int4 and the dense weights, and serves the workload's prompts (workload=instruct for
answers to real instructions) greedily with both. Prints perplexities, the share of
identical outputs, weight bytes, calibration time and peak memory, and where it all is."""


@dataclass
class Measured:
    """One weights option's figures."""

    option: str
    weight_bytes: int
    perplexity: float
    tokens: int
    predictions: torch.Tensor  # the most likely next token at every scored position
    served: Served


def main(args: list[str]) -> None:
    method, rest = _method(args)
    numbers, rest = take_counts(rest, {"windows": 16})
    print(quantize_main(compose(rest), method, numbers["windows"]))


def _method(args: list[str]) -> tuple[str, list[str]]:
    methods = [a.partition("=")[2] for a in args if a.startswith("method=")]
    rest = [a for a in args if not a.startswith("method=")]
    if len(methods) != 1 or methods[0] not in METHODS:
        raise ConfigError("method", f"give one of method={' | method='.join(METHODS)}")
    return methods[0], rest


def measure(cfg: DictConfig, windows: int) -> Measured:
    served = serve_outputs(run_spec(cfg))
    prepared = served.prepared
    tokenizer = prepared.served.loaded.tokenizer
    if tokenizer is None:
        raise ConfigError("model", "quantize needs a model with weights and a tokenizer")
    ids = tokenizer.encode(text_section("evaluation"))
    nll, predictions = 0.0, []
    model, attention = prepared.served.model, prepared.engine.runner.attention
    for logits, targets in window_logits(model, ids, attention, max_windows=windows):
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
        predictions.append(logits.argmax(-1))
    chosen = torch.cat(predictions)
    return Measured(
        prepared.started.strategy.weights.value,
        prepared.served.weight_bytes,
        math.exp(nll / chosen.shape[0]),
        int(chosen.shape[0]),
        chosen,
        served,
    )


def agreement(reference: Measured, other: Measured) -> dict[str, Any]:
    """Share of requests with identical greedy outputs, the mean share of each output that
    matches before the first difference, and the share of held-out positions where both
    predict the same next token (teacher-forced: each position sees the true text)."""
    prefixes, identical = [], 0
    for rid, expected in reference.served.outputs.items():
        got = other.served.outputs[rid]
        identical += got == expected
        same = next(
            (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
            min(len(expected), len(got)),
        )
        prefixes.append(same / max(len(expected), 1))
    workload = reference.served.prepared.workload
    same_next = (reference.predictions == other.predictions).float().mean()
    return {
        "reference": "dense",
        "identical_share": identical / len(prefixes),
        "matching_prefix_share": sum(prefixes) / len(prefixes),
        "next_token_share": float(same_next),
        "requests": len(prefixes),
        "workload": workload.name,
        "workload_hash": workload.hash,
    }


def quantize_main(cfg: DictConfig, method: str, windows: int) -> str:
    quantised = measure(serving_weights(cfg, f"int4-{method}"), windows)
    dense = measure(serving_weights(cfg, "dense"), windows)
    cache_dir = cache_dir_of(cfg)
    shared = agreement(dense, quantised)
    made = quantised.served.prepared.served.weights.record() or {}
    for measured in (dense, quantised):
        entry = perplexity_entry(measured.perplexity, measured.tokens, windows)
        updates: dict[str, Any] = {"perplexity": {"fp32": entry}}
        if measured is quantised:
            updates |= {"greedy_agreement": shared, "dense_perplexity_fp32": dense.perplexity}
        record_quality(cache_dir, measured.served.prepared.served.weights_id, updates)
    return render(dense, quantised, shared, made, cache_dir, windows)


def render(
    dense: Measured,
    quantised: Measured,
    shared: dict[str, Any],
    made: dict[str, Any],
    cache_dir: Any,
    windows: int,
) -> str:
    table = Table(title=f"int4 weights against dense (fp32, {windows} windows of held-out text)")
    columns = (
        "weights",
        "weight MiB",
        "perplexity",
        "greedy outputs = dense",
        "same prefix",
        "same next token",
    )
    for column in columns:
        table.add_column(column)
    for measured in (dense, quantised):
        is_dense = measured is dense
        share = "–" if is_dense else f"{shared['identical_share']:.1%} of {shared['requests']}"
        prefix = "–" if is_dense else f"{shared['matching_prefix_share']:.1%}"
        next_token = "–" if is_dense else f"{shared['next_token_share']:.1%}"
        table.add_row(
            measured.option,
            f"{measured.weight_bytes / 2**20:.1f}",
            f"{measured.perplexity:.3f}",
            share,
            prefix,
            next_token,
        )
    console = Console(record=True, width=120)
    with console.capture() as capture:
        console.print(table)
    lines = [capture.get().rstrip()]
    if "seconds" in made:
        peak = made.get("peak_rss_bytes") or 0
        lines.append(
            f"made in {made['seconds']:.1f} s, peak resident memory {peak / 2**30:.2f} GiB "
            f"({made.get('method')}, group {made.get('group_size')})"
        )
    if "folder" in made:
        lines.append(f"checkpoint and calibration record: {made['folder']}")
    weights_id = quantised.served.prepared.served.weights_id
    lines.append(f"quality record: {quality_path(cache_dir, weights_id)}")
    return "\n".join(lines)
