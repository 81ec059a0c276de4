"""Engine steps on the real model against this machine's floor: where the CPU time goes.

Drives the real engine (`build_engine`, the `vllm` strategy unless told otherwise) through
the step shapes the speed targets name, and prints, for each, the measured time of the
model forward, the floor (the step's FLOPs at the calibrated matmul peak, or its bytes at
the copy peak, whichever is larger; see `harness.measure.roofline`) and their ratio:

- `prefill-3000`: one fresh 3,000-token prompt;
- `prefill-8x200`: eight fresh 200-token prompts in one step;
- `decode-64`: one decode step of 64 sequences with 32-256-token contexts;
- `decode-1`: one sequence decoding at a 231+64-token context (per-token time, MBU).

Usage: python -m benchmarks.bench_steps [--dtype bf16] [--cases a,b] [--repeats 5]
       [--profile CASE] [--strategy vllm] [override ...]
Run it on a quiet machine; it measures the median of `--repeats` timed runs per case.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from servelab.engine.engine import Engine
from servelab.engine.request import Request, SamplingParams
from servelab.harness.measure.roofline import step_cost, utilisation
from servelab.harness.run.build import build_engine
from servelab.harness.run.compose import compose
from servelab.harness.run.spec import engine_spec
from servelab.harness.run.startup import start_engine

CASES = ("prefill-3000", "prefill-8x200", "decode-64", "decode-1")


def _requests(lengths: list[int], max_tokens: int, seed: int = 0) -> list[Request]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Request(
            id=f"r{i}",
            prompt_ids=torch.randint(100, 40000, (n,), generator=generator).tolist(),
            sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        )
        for i, n in enumerate(lengths)
    ]


def _case_requests(case: str) -> tuple[list[Request], int]:
    """The requests of a case and how many steps to run before the timed one."""
    if case == "prefill-3000":
        return _requests([3000], 1), 0
    if case == "prefill-8x200":
        return _requests([200] * 8, 1), 0
    if case == "decode-64":
        lengths = torch.linspace(32, 256, 64).round().int().tolist()
        return _requests(lengths, 32), 1 + 16  # the prefill, then 16 decode steps
    if case == "decode-1":
        return _requests([231], 128), 1 + 64
    raise SystemExit(f"unknown case {case!r}; choose from {', '.join(CASES)}")


def time_case(engine_factory, case: str, profile: bool) -> tuple[float, dict]:
    engine: Engine = engine_factory()
    requests, warm_steps = _case_requests(case)
    for request in requests:
        engine.add_request(request)
    for _ in range(warm_steps):
        engine.step()
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            result = engine.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    else:
        result = engine.step()
    return result.record.model_s, {"shape": result.shape, "record": result.record}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", default=None, help="print a profiler table for one case")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose(["strategy=vllm", "engine.kv_budget=512MiB", "engine.max_batch_size=64",
                   "engine.max_num_batched_tokens=4096", *args.overrides])  # fmt: skip
    clock_start = time.perf_counter()
    started = start_engine(engine_spec(cfg), lambda: time.perf_counter() - clock_start)
    settings, strategy, served = started.settings, started.strategy, started.served
    roofline = started.roofline
    if roofline is None or roofline.peaks is None:
        raise SystemExit(
            "bench_steps divides by the calibrated peaks: drop telemetry.roofline=false"
        )
    peaks = roofline.peaks

    def factory() -> Engine:
        return build_engine(
            served.model, settings, strategy, lambda: time.perf_counter() - clock_start
        )

    flops, copy = peaks.matmul_flops_per_s / 1e9, peaks.copy_bytes_per_s / 1e9
    print(f"dtype {settings.dtype}, threads {torch.get_num_threads()}, peaks {flops:.0f} "
          f"GFLOP/s, {copy:.0f} GB/s")  # fmt: skip
    print(f"{'case':<15}{'median ms':>11}{'floor ms':>10}{'x floor':>9}{'MFU':>7}{'MBU':>7}")
    for case in args.cases.split(","):
        times, shape = [], None
        for _ in range(args.repeats):
            seconds, info = time_case(factory, case, profile=False)
            times.append(seconds)
            shape = info["shape"]
        if args.profile == case:
            time_case(factory, case, profile=True)
        median = statistics.median(times)
        cost = step_cost(
            roofline.shape, roofline.weight_bytes, shape.query_lens, shape.seq_lens,
            shape.num_logits, roofline.kv_bytes_per_element, roofline.act_bytes_per_element,
            roofline.stored_kv_heads,
        )  # fmt: skip
        floor = max(cost.flops / peaks.matmul_flops_per_s, cost.bytes / peaks.copy_bytes_per_s)
        mfu, mbu = utilisation(cost, median, peaks)
        print(f"{case:<15}{median * 1e3:>11.1f}{floor * 1e3:>10.1f}{median / floor:>9.2f}"
              f"{mfu:>7.2f}{mbu:>7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
