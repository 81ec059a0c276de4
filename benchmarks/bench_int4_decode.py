"""Decode end to end for each weights option: step time, tokens/s, and the linear layers' share.

For each option and batch size, `batch` requests of real text (prompt `--prompt` tokens from
the prompts section, `--steps` output tokens, EOS ignored) are served offline by the real
engine (`--preset`, default orca); the table gives the median decode step (every request
decoding one token), the output tokens per second that implies, and the share of those
steps spent inside the linear layers (q/k/v/o, gate/up/down; timed with forward hooks, which
add about a microsecond per layer call). The LM head is dense in every option and counts as
the rest of the step.

    python -m benchmarks.bench_int4_decode                  # dense, int4-rtn, int4-awq; batch 1, 32
    python -m benchmarks.bench_int4_decode --weights dense int4-awq --batches 1 --steps 64
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from servelab.engine.request import Request, SamplingParams
from servelab.harness.run.compose import compose
from servelab.harness.run.replay import serve_all
from servelab.harness.run.spec import engine_spec
from servelab.harness.run.startup import start_engine
from servelab.models.model import LlamaModel
from servelab.workloads.text import text_section


@dataclass(frozen=True)
class BenchConfig:
    weights: tuple[str, ...] = ("dense", "int4-rtn", "int4-awq")
    batches: tuple[int, ...] = (1, 32)
    prompt: int = 231
    steps: int = 64
    preset: str = "orca"
    dtype: str = "bf16"
    overrides: tuple[str, ...] = ()


class LinearTimer:
    """Seconds spent in the decoder layers' linears, per model forward."""

    def __init__(self, model: LlamaModel) -> None:
        self.per_forward: list[float] = []
        self._current = 0.0
        self._started: dict[int, float] = {}
        model.register_forward_pre_hook(self._forward_started)
        model.register_forward_hook(self._forward_ended)
        for layer in model.layers:
            for module in layer.modules():
                if hasattr(module, "in_features"):
                    module.register_forward_pre_hook(self._linear_started)
                    module.register_forward_hook(self._linear_ended)

    def _forward_started(self, *args: object) -> None:
        self._current = 0.0

    def _forward_ended(self, *args: object) -> None:
        self.per_forward.append(self._current)

    def _linear_started(self, module: torch.nn.Module, *args: object) -> None:
        self._started[id(module)] = time.perf_counter()

    def _linear_ended(self, module: torch.nn.Module, *args: object) -> None:
        self._current += time.perf_counter() - self._started[id(module)]


def prompts(count: int, length: int, tokenizer) -> list[list[int]]:
    ids = tokenizer.encode(text_section("prompts"))
    return [ids[i * length : (i + 1) * length] for i in range(count)]


def bench(config: BenchConfig) -> Iterator[str]:
    yield (
        f"decode steps, {config.preset}, {config.dtype}, prompt {config.prompt} tokens, "
        f"{config.steps} out, {torch.get_num_threads()} threads"
    )
    yield f"{'weights':>9} {'batch':>5} {'step ms':>8} {'tok/s':>7} {'linears':>8} {'MiB':>6}"
    for weights in config.weights:
        for batch in config.batches:
            cfg = compose(
                [
                    f"strategy={config.preset}",
                    f"strategy.weights={weights}",
                    f"engine.dtype={config.dtype}",
                    f"engine.max_batch_size={batch}",
                    "telemetry.roofline=false",
                    *config.overrides,
                ]
            )
            started = start_engine(engine_spec(cfg), time.perf_counter)
            served, engine = started.served, started.engine
            timer = LinearTimer(served.model)
            sampling = SamplingParams(max_tokens=config.steps, ignore_eos=True)
            tokenizer = started.tokenizer
            requests = [
                Request(id=str(i), prompt_ids=p, sampling=sampling)
                for i, p in enumerate(prompts(batch, config.prompt, tokenizer))
            ]
            results = serve_all(engine, requests)
            decode = [
                (r.record.t_end - r.record.t_start, linear)
                for r, linear in zip(results, timer.per_forward, strict=True)
                if r.record.prefill_tokens == 0 and r.record.decode_tokens == batch
            ]
            step = statistics.median(d for d, _ in decode)
            share = sum(linear for _, linear in decode) / sum(d for d, _ in decode)
            mib = served.weight_bytes / 2**20
            yield (
                f"{weights:>9} {batch:5d} {step * 1e3:8.2f} {batch / step:7.1f} "
                f"{share:8.1%} {mib:6.1f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = BenchConfig()
    parser.add_argument("--weights", nargs="+", default=list(defaults.weights))
    parser.add_argument("--batches", type=int, nargs="+", default=list(defaults.batches))
    parser.add_argument("--prompt", type=int, default=defaults.prompt)
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--preset", default=defaults.preset)
    parser.add_argument("--dtype", default=defaults.dtype)
    parser.add_argument("overrides", nargs="*", help="more config overrides")
    args = parser.parse_args()
    config = BenchConfig(
        weights=tuple(args.weights),
        batches=tuple(args.batches),
        prompt=args.prompt,
        steps=args.steps,
        preset=args.preset,
        dtype=args.dtype,
        overrides=tuple(args.overrides),
    )
    for line in bench(config):
        print(line, flush=True)


if __name__ == "__main__":
    main()
