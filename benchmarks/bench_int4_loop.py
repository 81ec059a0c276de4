"""Time the compiled int4 loop against torch's int4 CPU kernel on the same packed weights.

For 1 and 4 rows (decode steps of few sequences) of the embedded model's int4 shapes, in
bfloat16 on one thread: the median microseconds of `int4_matvec` (at this level's build and
torch's packing block) and of `aten._weight_int4pack_mm_for_cpu`. `int4_loop_block` in
`kernels/int4_matmul_cpu.py` dispatches the loop only where this table says it pays.

    python -m benchmarks.bench_int4_loop
"""

from __future__ import annotations

import torch

from benchmarks.timing import time_call
from servelab.kernels.capabilities import capabilities
from servelab.kernels.cpu_build import active_build_status, cpu_ops
from servelab.kernels.int4_layout import num_groups, pack_int4
from servelab.kernels.int4_matmul_cpu import to_cpu_packed

CPU = torch.device("cpu")
REPEATS = 50
SHAPES = ((576, 1536, 64), (1536, 576, 128), (576, 192, 64))  # (in, out, group)


def main() -> None:
    ops, caps = cpu_ops(), capabilities()
    if ops is None or caps.torch_int4_block is None:
        raise SystemExit(f"bench_int4_loop: no loop to time ({active_build_status()})")
    torch.set_num_threads(1)
    print(f"level {caps.level}, torch {caps.torch_cpu_capability}, block {caps.torch_int4_block}")
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 4):
        for in_features, out_features, group in SHAPES:
            groups = num_groups(in_features, group)
            values = torch.randint(0, 16, (in_features, out_features), generator=generator)
            zeros = torch.randint(0, 16, (groups, out_features), generator=generator)
            scales = torch.rand(groups, out_features, generator=generator) * 0.02 + 0.001
            packed, pairs = to_cpu_packed(
                pack_int4(values), pack_int4(zeros), scales, group, torch.bfloat16
            )
            x = torch.randn(rows, in_features, generator=generator).to(torch.bfloat16)
            loop = 1e6 * time_call(
                lambda x=x, p=packed, s=pairs, g=group: ops.int4_matvec(
                    x, p, s, g, caps.torch_int4_block
                ),
                CPU,
                REPEATS,
            )
            theirs = 1e6 * time_call(
                lambda x=x, p=packed, s=pairs, g=group: torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x, p, g, s
                ),
                CPU,
                REPEATS,
            )
            print(
                f"rows {rows} {out_features}x{in_features} g{group}: int4 loop {loop:.0f} us, "
                f"torch {theirs:.0f} us, loop/torch speed {theirs / loop:.2f}x"
            )


if __name__ == "__main__":
    main()
