"""Count what one decode step of the GPU code path launches, per layer and per step.

The GPU code path is the one `engine.device=cuda` runs: the Triton attention and, where they
apply, the fused layers (`models/gpu_layers.py`). A `strategy=vllm` engine serves
`--batches` requests until every one of them decodes, then one more decode step is counted
(`count_launches`: operators that launch kernels, views, syncs, host-to-device transfers,
Triton launches). The count does not depend on sizes or speed, so on a CPU it runs the Triton
kernels under the interpreter and the shape's layers at full width; the model is built with
one layer and with two, so that the difference is one layer's launches and the rest is the
step's own, and the step of the shape's full depth is their sum. On a CPU the rest counts the
host's own work on the batch too, which a GPU runs without a launch. The count is of the eager
step (`cuda_graphs` off): what a CUDA graph captures and then replays in one launch.

    python -m benchmarks.bench_launches                          # llama3-8b, batches 1 and 32
    python -m benchmarks.bench_launches --shape tiny --attention torch
    python -m benchmarks.bench_launches --strategy vllm-awq      # the int4 layers' kernels
    python -m benchmarks.bench_launches --device cuda            # on a GPU: the same count
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, replace

import torch

if not torch.cuda.is_available():  # the Triton kernels under the interpreter, set before import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from servelab.engine.engine import Engine  # noqa: E402
from servelab.engine.kv_cache import KVLayout  # noqa: E402
from servelab.engine.request import Request, SamplingParams  # noqa: E402
from servelab.harness.checks.launches import Launches, count_launches  # noqa: E402
from servelab.harness.run.build import build_engine, random_model  # noqa: E402
from servelab.harness.run.compose import compose  # noqa: E402
from servelab.harness.run.settings import EngineSettings  # noqa: E402
from servelab.models.dummy import DUMMY_SHAPES  # noqa: E402
from servelab.models.model import ModelConfig  # noqa: E402
from servelab.strategies.settings import strategy_settings  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PROMPT = 16  # tokens of each request's prompt
OUTPUT = 8  # tokens each request generates: the counted step is well before its end


@dataclass(frozen=True)
class StepLaunches:
    """One decode step's launches: one layer's, the rest of the step's, and the whole step
    of `layers` layers."""

    batch: int
    layers: int
    per_layer: Launches
    fixed: Launches

    @property
    def step(self) -> Launches:
        total = self.fixed
        for _ in range(self.layers):
            total = total.plus(self.per_layer)
        return total


def decode_engine(
    shape: ModelConfig,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
    attention: str,
    strategy_name: str,
) -> Engine:
    """An engine over `shape` with random weights on the GPU code path, `batch` requests in;
    int4 weights multiplied by the Triton kernels, as on CUDA."""
    node = compose([f"strategy={strategy_name}"]).strategy
    if "int4_kernel" in node:
        node.int4_kernel = "triton"
    strategy = strategy_settings(node)
    model = random_model(shape, strategy.weights, dtype, device)
    layout = KVLayout(shape.num_layers, model.kv_heads_stored, shape.head_dim, dtype)
    settings = EngineSettings(
        device=device, dtype=dtype, dtype_reason="set",
        kv_budget_bytes=2 * batch * (PROMPT + OUTPUT + 16) * layout.bytes_per_token,
        kv_budget_fraction=None, max_batch_size=batch,
        max_num_batched_tokens=max(batch * PROMPT, 256), attention=attention,
        fused_decode=True, cuda_graphs=False, seed=0, warmup=False,
    )  # fmt: skip
    engine = build_engine(model, settings, strategy, time.monotonic)
    generator = torch.Generator().manual_seed(batch)
    for index in range(batch):
        prompt = torch.randint(0, shape.vocab_size, (PROMPT,), generator=generator).tolist()
        sampling = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
        engine.add_request(Request(id=str(index), prompt_ids=prompt, sampling=sampling))
    return engine


def one_decode_step(engine: Engine, batch: int) -> Launches:
    """Steps until the whole batch has decoded once (every path warmed), then counts the next
    decode step."""
    while True:
        result = engine.step()
        assert result is not None, "the engine ran out of work before the batch decoded"
        if result.record.prefill_tokens == 0 and result.record.decode_tokens == batch:
            break
    with count_launches() as counts:
        result = engine.step()
    assert result is not None and result.record.prefill_tokens == 0
    return counts


def step_launches(
    shape: ModelConfig,
    batch: int,
    dtype: torch.dtype,
    device: torch.device,
    attention: str,
    strategy: str = "vllm",
) -> StepLaunches:
    one, two = (
        one_decode_step(
            decode_engine(replace(shape, num_layers=n), batch, dtype, device, attention, strategy),
            batch,
        )
        for n in (1, 2)
    )
    per_layer = two.minus(one)
    return StepLaunches(batch, shape.num_layers, per_layer, one.minus(per_layer))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(DUMMY_SHAPES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument(
        "--dtype",
        default=None,
        choices=sorted(DTYPES),
        help="bf16; fp16 where "
        "Triton is interpreted (it computes bf16 wrongly; the count is the same)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attention", default="triton", choices=["triton", "torch"])
    parser.add_argument("--strategy", default="vllm", help="vllm-awq: the int4 layers")
    args = parser.parse_args()
    device = torch.device(args.device)
    interpreted = device.type == "cpu" and args.attention == "triton"
    dtype = args.dtype or ("fp16" if interpreted else "bf16")
    shape = DUMMY_SHAPES[args.shape]
    print(
        f"one decode step of the GPU code path: strategy {args.strategy}, "
        f"{args.shape} ({shape.num_layers} layers), "
        f"{dtype}, attention {args.attention}, on {device.type}"
    )
    print(f"{'batch':>5} {'where':>9} {'kernels':>8} {'triton':>6} {'views':>6} "
          f"{'transfers':>9} {'syncs':>5}")  # fmt: skip
    for batch in args.batches:
        counted = step_launches(shape, batch, DTYPES[dtype], device, args.attention, args.strategy)
        for where, launches in (
            ("a layer", counted.per_layer), ("the rest", counted.fixed), ("the step", counted.step)
        ):  # fmt: skip
            print(f"{batch:>5} {where:>9} {launches.kernels:>8} {launches.triton:>6} "
                  f"{launches.views:>6} {launches.transfers:>9} {launches.syncs:>5}")  # fmt: skip
        common = ", ".join(
            f"{n.removeprefix('aten::')} {c}" for n, c in counted.per_layer.names.most_common(8)
        )
        print(f"      a layer's operators: {common}")


if __name__ == "__main__":
    main()
