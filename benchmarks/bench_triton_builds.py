"""Compile for a CUDA GPU, on any machine, every Triton build the GPU check's runs launch.

A Triton kernel compiles when it first launches, so one that cannot compile for the GPU (or
takes more shared memory than a block may) would fail only once GPU time is being spent. This
runs a one-layer engine of each strategy the GPU check runs (`scripts/gpu_check.sh`), on the
GPU code path under the interpreter, through prefill and decode at each batch size, records
every distinct build its Triton kernels launch (`harness/checks/triton_builds.py`), and
compiles each for the architecture in float16 and bfloat16: one line a build with its shared
memory against the architecture's limit, exit status 1 if any fails to compile or fit.

The int4 strategy runs on `--int4-shape` (`tiny`): its products' builds depend on the row
count and on whether the input dimension is split, not on the layer's width, and a wide int4
layer runs slowly in the interpreter. A CPU plans the decode attention as on one
multiprocessor, so its runs split a sequence less than a GPU's do; the decode attention is
also launched on the shape's heads at every split count a GPU may choose (powers of two up to
`MAX_SPLITS`), each a build of its merge kernel.

    python -m benchmarks.bench_triton_builds                  # sm_90: H100, H200
    python -m benchmarks.bench_triton_builds --arch 80        # A100
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the Triton kernels under the interpreter, set before import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.bench_launches import decode_engine  # noqa: E402
from servelab.harness.checks.triton_builds import (  # noqa: E402
    SHARED_LIMIT,
    KernelBuild,
    compile_builds,
    ptxas_missing,
    record_builds,
)
from servelab.kernels import paged_attention_triton as tri  # noqa: E402
from servelab.models.dummy import DUMMY_SHAPES  # noqa: E402
from servelab.models.model import ModelConfig  # noqa: E402

STRATEGIES = ("vllm", "vllm-awq", "orca", "fastertransformer")  # the GPU check's runs
INT4 = ("vllm-awq",)


def engine_builds(shape: ModelConfig, strategy: str, batch: int) -> set[KernelBuild]:
    """The builds a one-layer engine of `shape` launches serving `batch` requests to the end."""
    engine = decode_engine(
        replace(shape, num_layers=1), batch, torch.float16, torch.device("cpu"), "triton", strategy
    )
    with record_builds() as builds:
        while engine.step() is not None:
            pass
    return builds


def split_builds(shape: ModelConfig) -> set[KernelBuild]:
    """The builds of one paged decode of `shape`'s heads at each split count a GPU may choose."""
    heads, kv_heads, dim, block = shape.num_heads, shape.num_kv_heads, shape.head_dim, 16
    block_n = tri.decode_launch(1, kv_heads, 1, dim, torch.device("cpu")).block_n
    max_len = tri.MAX_SPLITS * block_n
    k_cache = torch.zeros(max_len // block, block, kv_heads, dim, dtype=torch.float16)
    tables = torch.arange(max_len // block, dtype=torch.int32)[None, :]
    q, lens = torch.zeros(1, heads, dim, dtype=torch.float16), torch.tensor([max_len])
    with record_builds() as builds:
        for splits in (2**i for i in range(tri.MAX_SPLITS.bit_length())):
            launch = tri.make_launch(block_n, max_len, splits)
            tri.paged_decode_triton(q, k_cache, k_cache, tables, lens, 1.0, launch=launch)
    return builds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, choices=sorted(SHARED_LIMIT), default=90)
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(DUMMY_SHAPES))
    parser.add_argument("--int4-shape", default="tiny", choices=sorted(DUMMY_SHAPES))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 9])
    parser.add_argument(
        "--triton-from", type=Path, default=None,
        help="compile with the triton in this folder (e.g. the GPU machine's version: "
        "pip install --no-deps --target DIR triton==VERSION); default: this environment's",
    )  # fmt: skip
    args = parser.parse_args()
    if torch.cuda.is_available():
        sys.exit("a CUDA device is here: its kernel tests compile and run the kernels themselves")
    if missing := ptxas_missing():
        sys.exit(f"cannot compile for a GPU here: {missing}")
    builds: set[KernelBuild] = set()
    for strategy in args.strategies:
        shape = args.int4_shape if strategy in INT4 else args.shape
        for batch in args.batches:
            start = time.monotonic()
            builds |= engine_builds(DUMMY_SHAPES[shape], strategy, batch)
            print(f"recorded {strategy} on {shape} at batch {batch}: {len(builds)} builds so far "
                  f"({time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip
    start = time.monotonic()
    builds |= split_builds(DUMMY_SHAPES[args.shape])
    print(f"recorded the decode attention of {args.shape} at 1 to {tri.MAX_SPLITS} splits: "
          f"{len(builds)} builds ({time.monotonic() - start:.0f} s)", flush=True)  # fmt: skip
    ordered = sorted(builds, key=repr)
    results = compile_builds(ordered, args.arch, args.triton_from)
    limit = SHARED_LIMIT[args.arch]
    versions = ", ".join(sorted({r.triton for r in results}))
    print(f"\n{len(ordered)} builds compiled for sm_{args.arch} by triton {versions} "
          f"(shared memory limit {limit} B)")  # fmt: skip
    print(f"{'':4} {'float':5} {'shared B':>8} {'warps':>5}  build")
    for result in results:
        verdict = "ok" if result.fits(args.arch) else "FAIL"
        print(f"{verdict:4} {result.float_type:5} {result.shared:>8} {result.warps:>5}  "
              f"{result.build.label}{'  ' + result.error if result.error else ''}")  # fmt: skip
    failed = sum(not r.fits(args.arch) for r in results)
    print(f"{len(results) - failed} of {len(results)} compiled and fit; {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
