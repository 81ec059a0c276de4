"""Time fp32 products: torch's product (MKL) against `panel_linear_f32` on packed panels.

For each row count and each weight shape of the embedded model (a decoder projection, the
down projection, the LM head) it prints GFLOP/s and the rate the weight is read at for both,
the speed-up, and the largest difference between the two outputs. Why fp32 layers take the
panels at every row count (`kernels/linear.py`) rests on this table. Each weight is used again
and again, so it is read from cache where it fits, as a step's are not.

    python -m benchmarks.bench_linear_f32                  # one thread, rows 1..2048
    python -m benchmarks.bench_linear_f32 --threads 2 --rows 1 3 8 64
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.timing import time_call
from servelab.kernels.capabilities import capabilities
from servelab.kernels.cpu_build import active_build_status, cpu_ops

CPU = torch.device("cpu")
SHAPES = ((1536, 576), (576, 1536), (49152, 576))  # (out, in): up/gate, down, LM head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, nargs="+", default=[1, 3, 8, 16, 32, 64, 128, 256, 2048]
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    ops = cpu_ops()
    if ops is None:
        raise SystemExit(f"bench_linear_f32: the compiled operators: {active_build_status()}")
    torch.set_num_threads(args.threads)
    print(
        f"level {capabilities().level}, torch {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} thread(s)"
    )
    print(
        f"{'rows':>5} {'weight':>10} {'torch GF/s':>11} {'GB/s':>6} {'ours GF/s':>10} "
        f"{'GB/s':>6} {'speed-up':>9} {'max diff':>9}"
    )
    generator = torch.Generator().manual_seed(0)
    for rows in args.rows:
        for n_len, k_len in SHAPES:
            x = torch.randn(rows, k_len, generator=generator)
            w = torch.randn(n_len, k_len, generator=generator)
            panels = ops.pack_panels_f32(w)
            theirs = time_call(lambda x=x, w=w: F.linear(x, w), CPU, args.repeats)
            ours = time_call(
                lambda x=x, p=panels, n=n_len: ops.panel_linear_f32(x, p, n), CPU, args.repeats
            )
            flops, weight_bytes = 2 * rows * n_len * k_len, n_len * k_len * 4
            diff = (ops.panel_linear_f32(x, panels, n_len) - F.linear(x, w)).abs().max().item()
            print(
                f"{rows:>5} {n_len:>5}x{k_len:<4} {flops / theirs / 1e9:>11.1f} "
                f"{weight_bytes / theirs / 1e9:>6.1f} {flops / ours / 1e9:>10.1f} "
                f"{weight_bytes / ours / 1e9:>6.1f} {theirs / ours:>8.2f}x {diff:>9.1e}"
            )


if __name__ == "__main__":
    main()
