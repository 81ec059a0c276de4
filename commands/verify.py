"""`servelab verify`: does each strategy serve exactly the tokens of the plain path?

The reference is static batching with contiguous KV and standard decoding, in the same dtype,
on the same workload (greedy). Every other strategy is served offline on the same requests and its
outputs compared request by request. In fp32 a lossless strategy must match every request.
In bf16 a different batch shape may round differently and flip a near-tie, so for each
request that diverges the reference model is asked for its margin between its two best
logits at the first differing position: a tiny margin explains a flip, a large one is a bug.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from servelab.base.batch import ForwardBatch
from servelab.engine.engine import Engine
from servelab.engine.kv_cache import KVLayout, allocate_kv_cache
from servelab.harness.run.compose import check_group_choices, compose
from servelab.harness.run.offline import serve_outputs
from servelab.harness.run.spec import run_spec
from servelab.models.model import AttentionFn, LlamaModel

REFERENCE = "fastertransformer"
SUMMARY = "each strategy's greedy tokens against static batching, with margins at divergences"
USAGE = """usage: servelab verify [strategies=a,b,...] [out=FILE] [OVERRIDE ...]

Serves the workload offline under static batching and under each strategy (default: orca,
orca-chunked, vllm) and compares the greedy outputs request by request; at each first
divergence it prints the reference's margin between its two best logits."""


@dataclass
class Divergence:
    request: str
    position: int  # index into the output where the tokens first differ
    reference_token: int
    strategy_token: int
    reference_margin: float  # top-1 minus top-2 logit of the reference at that position


@dataclass
class StrategyCheck:
    strategy: str
    requests: int
    identical: int
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def identical_share(self) -> float:
        return self.identical / self.requests if self.requests else 0.0


def next_token_margin(model: LlamaModel, attention: AttentionFn, tokens: list[int]) -> float:
    """Top-1 minus top-2 logit of the next token after `tokens`, computed cache-free."""
    config = model.config
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    layout = KVLayout(config.num_layers, model.kv_heads_stored, config.head_dim, dtype)
    cache = allocate_kv_cache(layout, layout.bytes_per_token * len(tokens), 1, device)
    batch = ForwardBatch.single(torch.tensor(tokens)).to(device)
    top = model(batch, cache.k, cache.v, attention)[0].topk(2).values
    return float(top[0] - top[1])


def compare(
    strategy: str,
    reference: dict[str, list[int]],
    outputs: dict[str, list[int]],
    prompts: dict[str, list[int]],
    reference_engine: Engine,
) -> StrategyCheck:
    check = StrategyCheck(strategy, len(reference), 0)
    for rid, expected in reference.items():
        got = outputs[rid]
        if got == expected:
            check.identical += 1
            continue
        position = next(
            (i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b),
            min(len(expected), len(got)),
        )
        margin = next_token_margin(
            reference_engine.runner.model,
            reference_engine.runner.attention,
            prompts[rid] + expected[:position],
        )
        reference_token = expected[position] if position < len(expected) else -1
        strategy_token = got[position] if position < len(got) else -1
        check.divergences.append(Divergence(rid, position, reference_token, strategy_token, margin))
    return check


def reference_overrides(overrides: list[str]) -> list[str]:
    """The reference run's overrides: the user's, on static batching with plain decoding (an
    override such as `strategy.decoding=speculative` applies to every strategy compared, but
    the reference must stay the plain path)."""
    kept = [o for o in overrides if o.lstrip("+~").partition("=")[0] != "strategy.decoding"]
    return [*kept, f"strategy={REFERENCE}", "strategy.decoding=standard"]


def verify(
    strategies: list[str],
    overrides: list[str],
    compose: Callable[[list[str]], DictConfig],
    out: Path | None,
) -> list[StrategyCheck]:
    reference = serve_outputs(run_spec(compose(reference_overrides(overrides))))
    requests = reference.prepared.workload.requests
    prompts = {s.id: list(s.prompt_ids) for s in requests}
    checks = []
    for strategy in strategies:
        served = serve_outputs(run_spec(compose([*overrides, f"strategy={strategy}"])))
        checks.append(
            compare(strategy, reference.outputs, served.outputs, prompts, reference.prepared.engine)
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = [asdict(c) | {"identical_share": c.identical_share} for c in checks]
        out.write_text(json.dumps(payload, indent=2))
    return checks


def render_checks(checks: list[StrategyCheck], dtype: str) -> str:
    table = Table(title=f"greedy outputs against {REFERENCE} ({dtype})")
    for column in ("strategy", "identical", "share", "first divergences (request@pos: margin)"):
        table.add_column(column)
    for check in checks:
        shown = ", ".join(
            f"{d.request}@{d.position}: {d.reference_margin:.3g}" for d in check.divergences[:6]
        )
        extra = len(check.divergences) - 6
        table.add_row(
            check.strategy,
            f"{check.identical}/{check.requests}",
            f"{check.identical_share:.1%}",
            shown + (f" (+{extra} more)" if extra > 0 else ""),
        )
    console = Console(record=True, width=140)
    with console.capture() as capture:
        console.print(table)
    return capture.get()


def main(args: list[str]) -> None:
    strategies = ["orca", "orca-chunked", "vllm"]
    out = None
    rest = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "strategies":
            strategies = [s for s in value.strip("[]").split(",") if s]
        elif key == "out":
            out = Path(value)
        else:
            rest.append(arg)
    check_group_choices([f"strategy={s}" for s in strategies])
    cfg = compose(rest)
    checks = verify(strategies, rest, compose, out)
    print(render_checks(checks, str(cfg.engine.dtype)))
