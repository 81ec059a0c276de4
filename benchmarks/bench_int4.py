"""Time the linear layers of a decode step: dense weights against the int4 kernels.

One call multiplies a batch of `M` rows through every linear of a model of a named shape
(`--shape`, SmolLM2-135M's by default; llama3-8b's and the other dummy shapes too): its
layers (`--layers`, the shape's by default) x q, k, v, o, gate, up, down, with distinct
weights per layer, so that they stream from memory as in a real step rather than sit in
cache. Candidates, each in its own dtype:

- `dense`: `x @ W.T` with float weights (the `dense` weights option);
- `torch-packed`: torch's CPU int4 kernel after repacking (what `auto` serves on a CPU in
  bf16/fp16);
- `cpu-panels` (fp32 only): the compiled fp32 panels on nibbles (what `auto` serves on a CPU
  in fp32);
- `reference`: unpack AutoAWQ's layout, dequantise, multiply, every call;
- `cached-dense`: int4 weights dequantised once and kept as a float copy. As fast as
  `dense`, and as big: it gives up the memory saving, so the int4 formats do not use it;
- `triton` (CUDA only): the Triton int4 products (the GEMV up to `GEMV_ROWS` rows, the tiled
  GEMM beyond) with their default tiles; `--tiles` adds a `triton NxKxW` row for each other
  tiling named (output channels x input rows a step x warps), to pick the defaults by
  measurement. A tiling the GPU cannot run (too much shared memory) is reported as such.

The table gives the median milliseconds per call, the weight bytes one call reads, the rate
at which it reads them and that rate's share of this machine's calibrated copy peak
(`servelab calibrate`, measured once and cached), and the speed-up over dense weights in the
first dtype listed (bf16 by default) at the same batch.

    python -m benchmarks.bench_int4                        # CPU: batches 1 and 32, bf16 and fp32
    python -m benchmarks.bench_int4 --batches 1 8 32 --dtypes bf16 --threads 1
    python -m benchmarks.bench_int4 --device cuda --dtypes fp16
    python -m benchmarks.bench_int4 --device cuda --shape llama3-8b --batches 1 16 64
    python -m benchmarks.bench_int4 --device cuda --shape llama3-8b --batches 1 16 64 \
        --dtypes bf16 --tiles 128x32 32x64 64x64x8 128x128x8
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

from benchmarks.timing import time_call
from servelab.base.errors import ConfigError
from servelab.harness.measure.calibrate import measure_peaks
from servelab.kernels.int4_layout import num_groups, pack_int4
from servelab.kernels.int4_linear import Int4Linear
from servelab.kernels.int4_matmul import choose_kernel
from servelab.kernels.int4_matmul_triton import Tiles, int4_matmul_triton
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.model import ModelConfig

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def layer_shapes(shape: ModelConfig) -> tuple[tuple[int, int], ...]:
    """(in, out) of a layer's seven linears: q, k, v, o, gate, up, down."""
    hidden, inner = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return (hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inner), \
        (hidden, inner), (inner, hidden)  # fmt: skip


@dataclass(frozen=True)
class BenchConfig:
    batches: tuple[int, ...] = (1, 32)
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    shape: str = "smollm2-135m"  # a named shape (`models.dummy`): its layers' linears
    layers: int | None = None  # None: the shape's own
    group_size: int = 128
    device: str = "cpu"
    iters: int = 20
    threads: int | None = None
    cache_dir: str = "~/.cache/servelab"  # where the calibrated peaks are cached
    tiles: tuple[Tiles, ...] = ()  # Triton tilings timed beside the defaults (CUDA)


def int4_layer(in_features: int, out_features: int, kernel: str, config: BenchConfig, dtype):
    """An `Int4Linear` with random int4 weights, loaded as a checkpoint would load it."""
    device = torch.device(config.device)
    chosen = choose_kernel(kernel, device, dtype, in_features, out_features, config.group_size)
    groups = num_groups(in_features, config.group_size)
    state = {
        "qweight": pack_int4(torch.randint(0, 16, (in_features, out_features))),
        "qzeros": pack_int4(torch.randint(0, 16, (groups, out_features))),
        "scales": (torch.rand(groups, out_features) * 0.01 + 1e-3).half(),
    }
    layer = Int4Linear(chosen).to(device)
    layer.load_state_dict(state)
    return layer


class Tiled(torch.nn.Module):
    """A Triton int4 layer multiplied by other tiles than its kernel's defaults."""

    def __init__(self, layer: Int4Linear, tiles: Tiles) -> None:
        super().__init__()
        self.layer, self.tiles, self.in_features = layer, tiles, layer.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        return int4_matmul_triton(
            x, layer.qweight, layer.qzeros, layer.scales, layer.kernel.group_size, self.tiles
        )


def candidates(config: BenchConfig, dtype: torch.dtype) -> dict[str, list[torch.nn.Module]]:
    """Every candidate's linears for the whole model (distinct per layer)."""
    device = torch.device(config.device)
    shapes = [shape for _ in range(layer_count(config)) for shape in model_linears(config)]

    def dense(shape: tuple[int, int]) -> torch.nn.Module:
        return torch.nn.Linear(*shape, bias=False).to(device, dtype)

    kernels = ["triton"] if device.type == "cuda" else ["torch-packed", "reference"]
    if device.type == "cpu" and dtype == torch.float32:
        kernels.insert(1, "cpu-panels")
    out = {"dense": [dense(s) for s in shapes]}
    for kernel in kernels:
        out[kernel] = [int4_layer(*s, kernel, config, dtype) for s in shapes]
    for tiles in config.tiles if device.type == "cuda" else ():
        out[f"triton {tiles}"] = [Tiled(layer, tiles) for layer in out["triton"]]
    out["cached-dense"] = out["dense"]  # a dequantised copy is a dense layer of the same size
    return out


def model_linears(config: BenchConfig) -> tuple[tuple[int, int], ...]:
    if config.shape not in DUMMY_SHAPES:
        raise ConfigError("shape", f"unknown {config.shape!r}; known: {', '.join(DUMMY_SHAPES)}")
    return layer_shapes(DUMMY_SHAPES[config.shape])


def layer_count(config: BenchConfig) -> int:
    return config.layers or DUMMY_SHAPES[config.shape].num_layers


def weight_bytes(layers: list[torch.nn.Module]) -> int:
    return sum(
        t.numel() * t.element_size() for layer in layers for t in layer.state_dict().values()
    )


def bench(config: BenchConfig) -> Iterator[str]:
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "no CUDA device here; use --device cpu")
    if config.tiles and device.type != "cuda":
        raise ConfigError("tiles", "the Triton tilings run on CUDA only (--device cuda)")
    widths = sorted({in_features for in_features, _ in model_linears(config)})
    if config.threads:
        torch.set_num_threads(config.threads)
    yield (
        f"linear layers of one decode step: {config.shape}, {layer_count(config)} layers x 7 "
        f"linears, int4 group {config.group_size}, {device.type}, "
        f"{torch.get_num_threads()} threads"
    )
    yardstick = config.dtypes[0]
    peak = measure_peaks(device, DTYPES[yardstick], Path(config.cache_dir).expanduser())
    yield (
        f"copy peak {peak.copy_bytes_per_s / 1e9:.1f} GB/s ({yardstick}, calibrated on "
        f"{peak.host}; `servelab calibrate --refresh` measures it again)"
    )
    width = max([13, *(len(f"triton {tiles}") for tiles in config.tiles)])
    yield (
        f"{'dtype':>5} {'batch':>5} {'candidate':>{width}} {'ms':>8} {'MiB read':>9} "
        f"{'GB/s':>6} {'of peak':>7} {'vs dense ' + yardstick:>13}"
    )
    dense_ms: dict[int, float] = {}
    for name in config.dtypes:
        dtype = DTYPES[name]
        layers = candidates(config, dtype)
        for batch in config.batches:
            inputs = {width: torch.randn(batch, width, device=device, dtype=dtype)
                      for width in widths}  # fmt: skip
            for candidate, modules in layers.items():
                if candidate == "cached-dense" and name == "fp32":
                    continue

                def step(
                    modules: list[torch.nn.Module] = modules,
                    inputs: dict[int, torch.Tensor] = inputs,
                ) -> None:
                    with torch.inference_mode():
                        for module in modules:
                            module(inputs[module.in_features])

                try:
                    seconds = time_call(step, device, config.iters)
                except OutOfResources as err:  # a tiling the GPU cannot run
                    yield f"{name:>5} {batch:5d} {candidate:>{width}} does not fit: {err}"
                    continue
                if name == yardstick and candidate == "dense":
                    dense_ms[batch] = seconds
                size = weight_bytes(modules)
                yield (
                    f"{name:>5} {batch:5d} {candidate:>{width}} {seconds * 1e3:8.2f} "
                    f"{size / 2**20:9.1f} {size / seconds / 1e9:6.1f} "
                    f"{size / seconds / peak.copy_bytes_per_s:7.0%} "
                    f"{dense_ms[batch] / seconds:13.2f}"
                )


def tiles_arg(text: str) -> Tiles:
    try:
        return Tiles.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = BenchConfig()
    parser.add_argument("--batches", type=int, nargs="+", default=list(defaults.batches))
    parser.add_argument("--dtypes", nargs="+", default=list(defaults.dtypes), choices=DTYPES)
    parser.add_argument("--shape", default=defaults.shape, choices=sorted(DUMMY_SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="default: the shape's")
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--iters", type=int, default=defaults.iters)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", default=defaults.cache_dir, help="the calibrated peaks")
    parser.add_argument(
        "--tiles", type=tiles_arg, nargs="+", default=[], help="Triton tilings NxK[xW] (CUDA)"
    )
    args = parser.parse_args()
    config = BenchConfig(
        batches=tuple(args.batches),
        dtypes=tuple(args.dtypes),
        shape=args.shape,
        layers=args.layers,
        group_size=args.group_size,
        device=args.device,
        iters=args.iters,
        threads=args.threads,
        cache_dir=args.cache_dir,
        tiles=tuple(args.tiles),
    )
    try:
        for line in bench(config):
            print(line, flush=True)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
