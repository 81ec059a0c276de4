"""Paired speedup of speculative decoding over plain decoding, robust to a machine whose load
drifts: the strategies take turns on the same requests.

Every variant (the baseline first) is prepared once in this process on the same workload.
The requests are cut into rounds of `engine.max_batch_size`; each round is served offline by
every variant one after another, in an order that rotates from round to round, and each
variant's output tokens per second in that round is divided by the baseline's in the same
round. The table gives, per variant, the median and geometric mean of those ratios, the
acceptance rate, tokens emitted per target forward and the speedup predicted from them (the
harness's own definitions over all its steps), then where a decode step's time goes: over
the steps that prefill nothing, the mean step, its target forward with the acceptance rule
(`model_s`: gamma + 1 tokens per request verified and sampled), its proposing
(`spec_draft_s`) and the rest (scheduling, batch packing, KV bookkeeping). A shared machine
slows whole stretches of time; neighbouring turns see nearly the same slowdown, so the ratio
keeps what the strategy changes.

    python -m benchmarks.bench_speculative --batch 1 --variants \\
        "strategy=vllm-spec-ngram strategy.gamma=8" "strategy=vllm-spec-layerskip" \\
        -- workload=instruct workload.num_requests=16
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, field

from servelab.base.records import StepRecord
from servelab.engine.request import Request
from servelab.harness.measure.metrics import speculative_summary
from servelab.harness.run.compose import compose
from servelab.harness.run.prepare import Prepared, prepare
from servelab.harness.run.replay import serve_all, to_request
from servelab.harness.run.spec import run_spec


@dataclass
class Variant:
    label: str
    prepared: Prepared
    ratios: list[float] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0


def serve_round(variant: Variant, indices: list[int]) -> float:
    """Serve the workload's requests `indices` offline; output tokens per second."""
    specs = variant.prepared.workload.requests
    requests: list[Request] = [to_request(specs[i], i) for i in indices]
    start = time.perf_counter()
    results = serve_all(variant.prepared.engine, requests)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.output_ids) for r in requests)
    variant.steps += [result.record for result in results]
    variant.tokens += tokens
    variant.seconds += seconds
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="engine.max_batch_size per round")
    parser.add_argument("--baseline", default="strategy=vllm", help="overrides of the baseline")
    parser.add_argument("--variants", nargs="+", required=True, help="overrides, one string each")
    parser.add_argument("overrides", nargs="*", help="overrides every variant shares (after --)")
    args = parser.parse_args()
    shared = [*args.overrides, f"engine.max_batch_size={args.batch}", "telemetry.roofline=false"]
    variants = [
        Variant(
            label, prepare(run_spec(compose([*shared, *label.split()])), time.perf_counter, False)
        )
        for label in [args.baseline, *args.variants]
    ]
    count = len(variants[0].prepared.workload.requests)
    rounds = [list(range(i, min(i + args.batch, count))) for i in range(0, count, args.batch)]
    for number, indices in enumerate(rounds):
        order = variants[number % len(variants) :] + variants[: number % len(variants)]
        speed = {id(v): serve_round(v, indices) for v in order}
        for variant in variants[1:]:
            variant.ratios.append(speed[id(variant)] / speed[id(variants[0])])
        print(f"round {number + 1}/{len(rounds)} done", flush=True)
    print_table(variants, args.batch, len(rounds))


def print_table(variants: list[Variant], batch: int, rounds: int) -> None:
    print(f"\nbatch {batch}, {rounds} rounds; speedup = output tokens/s over the baseline's")
    header = ("variant", "tok/s", "median x", "geomean x", "alpha", "tok/fwd", "c", "predicted x")
    print(" | ".join(header))
    for variant in variants:
        figures = speculative_summary(variant.steps)
        ratios = variant.ratios or [1.0]
        row = (
            variant.label,
            f"{variant.tokens / variant.seconds:.2f}",
            f"{statistics.median(ratios):.2f}",
            f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}",
            _fmt(figures.get("acceptance_rate")),
            _fmt(figures.get("mean_accepted_length")),
            _fmt(figures.get("draft_cost_ratio")),
            _fmt(figures.get("predicted_speedup")),
        )
        print(" | ".join(row))
    print("\ndecode steps (no prefill), mean ms: forward and acceptance + proposing + rest")
    print(" | ".join(("variant", "steps", "step", "forward", "proposing", "rest")))
    for variant in variants:
        decode = [s for s in variant.steps if s.prefill_tokens == 0]
        if not decode:
            continue
        step = statistics.fmean(s.t_end - s.t_start for s in decode)
        forward = statistics.fmean(s.model_s for s in decode)
        proposing = statistics.fmean(s.counters.get("spec_draft_s", 0.0) for s in decode)
        row = (
            variant.label,
            str(len(decode)),
            *(f"{1000 * v:.1f}" for v in (step, forward, proposing, step - forward - proposing)),
        )
        print(" | ".join(row))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
