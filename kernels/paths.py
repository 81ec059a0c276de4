"""Which path each operation of a run takes, and why: what `meta.json` records under `kernels`.

A figure from a fast path and one from its portable twin are different measurements of the
same function, so a run says which it took: for prefill attention, decode attention, the
dense linears, the fused decoder layer and the int4 products, the path and the reason,
derived from the same answers the dispatch itself reads (`kernels.capabilities`, the build of
`kernels.cpu_build`, the attention implementation and the fused layer the engine installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from servelab.kernels.capabilities import Capabilities, capabilities
from servelab.kernels.cpu_attention import own_flash_built
from servelab.kernels.cpu_build import active_build_status, cpu_ops
from servelab.kernels.int4_matmul_cpu import int4_loop_block
from servelab.kernels.int4_matmul_triton import GEMV_ROWS


@dataclass(frozen=True)
class Path:
    path: str
    why: str


@dataclass(frozen=True)
class RunKernels:
    """What a run's engine was built with, as far as the dispatch depends on it."""

    device: torch.device
    dtype: torch.dtype
    attention_impl: str  # resolved: "torch", "cpu" or "triton"
    fused_layer: bool  # the engine installed a fused decoder stack (CPU or Triton)
    fused_setting: bool  # engine.fused_decode=auto
    int4_kernels: tuple[str, ...]  # the int4 kernels the model's layers chose; () when dense


def kernel_record(run: RunKernels) -> dict[str, object]:
    """`meta.json`'s `kernels`: the probe's answers, the build and each operation's path."""
    caps = capabilities()
    paths = {
        "prefill_attention": prefill_attention(run),
        "decode_attention": decode_attention(run, caps),
        "dense_linear": dense_linear(run, caps),
        "fused_layer": fused_layer(run),
        "int4_matmul": int4_matmul(run, caps),
    }
    return {
        **caps.record(),
        "build": None if run.device.type != "cpu" else (active_build_status() or "built"),
        "paths": {name: {"path": p.path, "why": p.why} for name, p in paths.items()},
    }


def _dtype(run: RunKernels) -> str:
    return str(run.dtype).removeprefix("torch.")


def prefill_attention(run: RunKernels) -> Path:
    if run.attention_impl == "triton":
        return Path("triton extend kernel", "CUDA")
    if run.attention_impl == "torch":
        return Path("PyTorch reference", "engine.attention=torch or no compiled build")
    if run.dtype == torch.bfloat16 and own_flash_built():
        return Path("compiled flash_attention (vdpbf16ps)", "bfloat16 at level avx512-bf16")
    why = (
        f"{_dtype(run)}: the compiled flash kernel is bfloat16 only"
        if run.dtype != torch.bfloat16
        else f"level {capabilities().level} has no AVX-512 BF16"
    )
    return Path("torch's CPU flash kernel", why)


def decode_attention(run: RunKernels, caps: Capabilities) -> Path:
    if run.attention_impl == "triton":
        return Path("triton paged decode kernel", "CUDA")
    if run.attention_impl == "torch":
        return Path("PyTorch reference", "engine.attention=torch or no compiled build")
    branch = "portable loops"
    if run.dtype == torch.bfloat16 and caps.level == "avx512-bf16":
        branch = "vdpbf16ps scores, AVX-512 softmax and values"
    elif run.dtype == torch.bfloat16 and caps.level == "avx512":
        branch = "AVX-512 fp32 lanes"
    return Path(f"compiled cpu_paged_attention, {branch}", f"{_dtype(run)} at level {caps.level}")


def dense_linear(run: RunKernels, caps: Capabilities) -> Path:
    if run.device.type != "cpu":
        return Path("torch linear", run.device.type)
    if run.dtype == torch.float32 and cpu_ops() is not None:
        return Path(
            "compiled panel_linear_f32 at every row count",
            "fp32: sums in one order whatever the batch, faster than MKL where measured",
        )
    if run.dtype != torch.bfloat16:
        return Path("torch linear (oneDNN / BLAS)", f"{_dtype(run)}: the plain layer")
    if caps.onednn_bf16:
        return Path(
            "oneDNN prepacked; compiled matvec for at most 4 rows",
            f"oneDNN multiplies bfloat16 at level {caps.level}",
        )
    if cpu_ops() is not None:
        return Path(
            "compiled matvec at every row count",
            f"oneDNN does not multiply bfloat16 at level {caps.level}",
        )
    return Path("torch linear (emulated bfloat16)", "no compiled build and no oneDNN bfloat16")


def fused_layer(run: RunKernels) -> Path:
    if run.fused_layer and run.attention_impl == "triton":
        return Path(
            "fused layers: concatenated qkv and gate-up products, Triton add-RMSNorm, rotary "
            "with the cache write, SiLU-and-multiply (models/gpu_layers.py)",
            "the Triton attention, plain linear layers",
        )
    if run.fused_layer:
        return Path("compiled decode_layer", "bfloat16 decode steps on the CPU operator")
    if not run.fused_setting:
        return Path("layer modules", "engine.fused_decode=off")
    return Path(
        "layer modules",
        f"the fused layer needs bfloat16 on the CPU attention operator, or the Triton attention "
        f"with plain linear layers ({_dtype(run)}, attention {run.attention_impl}, "
        f"{run.device.type})",
    )


def int4_matmul(run: RunKernels, caps: Capabilities) -> Path:
    if not run.int4_kernels:
        return Path("none", "dense weights")
    names = ", ".join(sorted(set(run.int4_kernels)))
    if "torch-packed" in run.int4_kernels and run.dtype == torch.bfloat16:
        if int4_loop_block() is None:
            return Path(
                f"{names}: torch's int4 kernel",
                f"level {caps.level}, torch packing blocks of {caps.torch_int4_block}: the int4 "
                "loop pays only on its AVX-512 BF16 branch",
            )
        return Path(
            f"{names}: compiled int4_matvec for at most 4 rows, torch's int4 kernel beyond",
            f"torch packs blocks of {caps.torch_int4_block} outputs "
            f"(its CPU capability: {caps.torch_cpu_capability})",
        )
    if "triton" in run.int4_kernels:
        names = f"{names}: GEMV up to {GEMV_ROWS} rows, tiled GEMM beyond, K split to fill the GPU"
    return Path(names, f"{_dtype(run)} on {run.device.type}")
