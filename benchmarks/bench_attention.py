"""Time paged decode attention: the Triton kernel against the PyTorch path, per layer call.

On CUDA both run as the engine runs them (the plan and launch sizes prepared once per batch,
outside the timing) and are timed with CUDA events around many calls (`benchmarks.timing`);
the table gives the median time per call and the bandwidth of reading every context's K and
V once. On a CPU only the PyTorch path
runs, timed with the wall clock. Every sequence has the full context length.

    python -m benchmarks.bench_attention                      # CUDA: batch 32/64 x context 512/2048
    python -m benchmarks.bench_attention --device cpu --batches 8 32 --contexts 256
    python -m benchmarks.bench_attention --q-heads 32 --kv-heads 8 --head-dim 128  # llama3-8b
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from benchmarks.timing import time_call
from servelab.base.errors import ConfigError
from servelab.kernels import paged_attention_triton as tri
from servelab.kernels.paged_attention_ref import plan_for, run_plan
from tests.attention_cases import AttentionCase, CaseShape, make_case

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class BenchConfig:
    """What to time: shapes, layout, dtype, device and repetitions."""

    batches: tuple[int, ...] = (32, 64)
    contexts: tuple[int, ...] = (512, 2048)
    q_heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    block_size: int = 16
    paged: bool = True
    dtype: str = "bf16"
    device: str = "cuda"
    iters: int = 20


def bench_case(config: BenchConfig, batch: int, context: int) -> dict[str, float]:
    """Seconds per call of each implementation, and their largest difference."""
    device = torch.device(config.device)
    shape = CaseShape(
        config.q_heads, config.kv_heads, config.head_dim, config.block_size, config.paged
    )
    case = make_case(
        [context] * batch, [1] * batch, shape, dtype=DTYPES[config.dtype], device=device
    )
    scale = config.head_dim**-0.5
    plan = plan_for(
        case.q,
        case.k_cache,
        case.seq_lens,
        case.query_start_loc,
        case.block_tables,
        case.slab_starts,
    )
    calls: dict[str, Callable[[], torch.Tensor]] = {
        "torch": lambda: run_plan(plan, case.q, case.k_cache, case.v_cache, scale)
    }
    if device.type == "cuda":
        calls["triton"] = _triton_call(case, scale, device)
    times = {name: time_call(fn, device, config.iters) for name, fn in calls.items()}
    if "triton" in calls:
        diff = (calls["triton"]().float() - calls["torch"]().float()).abs().max()
        times["max_abs_diff"] = float(diff)
    return times


def _triton_call(
    case: AttentionCase, scale: float, device: torch.device
) -> Callable[[], torch.Tensor]:
    batch, _, head_dim = case.q.shape
    launch = tri.decode_launch(
        batch, case.shape.kv_heads, int(case.seq_lens.max()), head_dim, device
    )
    paged = case.shape.paged
    kv_index = case.kv_index.to(device, torch.int32 if paged else torch.int64)
    seq_lens = case.seq_lens.to(device)
    return lambda: tri.decode_with_launch(
        case.q, case.k_cache, case.v_cache, kv_index, paged, seq_lens, scale, launch
    )


def run(config: BenchConfig) -> Iterator[str]:
    """Time every (batch, context) pair, yielding the table line by line."""
    if config.dtype not in DTYPES:
        raise ConfigError("dtype", f"unknown {config.dtype!r}; use one of {sorted(DTYPES)}")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "no CUDA device here; use --device cpu for the torch path")
    if config.q_heads % config.kv_heads:
        raise ConfigError(
            "kv_heads", f"{config.kv_heads} does not divide {config.q_heads} query heads"
        )
    elem = torch.finfo(DTYPES[config.dtype]).bits // 8
    yield (
        f"decode attention, {'paged' if config.paged else 'contiguous'} KV, {config.dtype}, "
        f"Hq={config.q_heads} Hkv={config.kv_heads} D={config.head_dim} on {config.device}"
    )
    yield (
        f"{'batch':>5} {'context':>7} {'torch ms':>9} {'triton ms':>9} {'speedup':>7} "
        f"{'triton GB/s':>11} {'max diff':>9}"
    )
    for batch in config.batches:
        for context in config.contexts:
            t = bench_case(config, batch, context)
            kv_bytes = 2 * batch * context * config.kv_heads * config.head_dim * elem
            tri_ms = f"{t['triton'] * 1e3:9.3f}" if "triton" in t else f"{'-':>9}"
            speedup = f"{t['torch'] / t['triton']:7.1f}" if "triton" in t else f"{'-':>7}"
            bw = f"{kv_bytes / t['triton'] / 1e9:11.0f}" if "triton" in t else f"{'-':>11}"
            diff = f"{t['max_abs_diff']:9.1e}" if "triton" in t else f"{'-':>9}"
            yield f"{batch:5d} {context:7d} {t['torch'] * 1e3:9.3f} {tri_ms} {speedup} {bw} {diff}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = BenchConfig()
    parser.add_argument("--batches", type=int, nargs="+", default=list(defaults.batches))
    parser.add_argument("--contexts", type=int, nargs="+", default=list(defaults.contexts))
    parser.add_argument("--q-heads", type=int, default=defaults.q_heads)
    parser.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--contiguous", action="store_true", help="slabs instead of blocks")
    parser.add_argument("--dtype", default=defaults.dtype, choices=sorted(DTYPES))
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--iters", type=int, default=defaults.iters)
    args = parser.parse_args()
    config = BenchConfig(
        batches=tuple(args.batches),
        contexts=tuple(args.contexts),
        q_heads=args.q_heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        paged=not args.contiguous,
        dtype=args.dtype,
        device=args.device,
        iters=args.iters,
    )
    try:
        for line in run(config):
            print(line, flush=True)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
