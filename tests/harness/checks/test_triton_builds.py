"""Every Triton kernel of the GPU code path compiles for an H100/H200 (sm_90) on any machine
(`harness/checks/triton_builds.py`): the builds a one-layer engine launches, recorded under
the interpreter, compiled by Triton's own compiler for the architecture, shared memory within
its limit; a build that cannot compile or fit is reported as such."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace

import pytest
import torch
import triton

import servelab.kernels
from benchmarks.bench_triton_builds import engine_builds, split_builds
from servelab.harness.checks.triton_builds import (
    SHARED_LIMIT,
    KernelBuild,
    build_of,
    compile_builds,
    ptxas_missing,
)
from servelab.models.dummy import DUMMY_SHAPES

if torch.cuda.is_available():
    pytest.skip("a CUDA host compiles the kernels in its kernel tests", allow_module_level=True)
if missing := ptxas_missing():
    pytest.skip(f"cannot compile for a GPU here: {missing}", allow_module_level=True)

SM90 = 90


def gpu_path_kernels() -> set[str]:
    """Every Triton kernel the kernels package defines (a launchable one, not a helper)."""
    names = set()
    for module in pkgutil.iter_modules(servelab.kernels.__path__):
        loaded = importlib.import_module(f"servelab.kernels.{module.name}")
        for name, value in vars(loaded).items():
            launchable = isinstance(value, triton.runtime.KernelInterface)
            if launchable and value.fn.__module__ == loaded.__name__ and name.endswith("_kernel"):
                names.add(name)
    return names


@pytest.fixture(scope="module")
def builds() -> list[KernelBuild]:
    recorded: set[KernelBuild] = set()
    tiny = DUMMY_SHAPES["tiny"]
    for strategy, batch in (("vllm-awq", 1), ("vllm-awq", 9), ("orca", 1)):  # paged, not
        recorded |= engine_builds(tiny, strategy, batch)
    return sorted(recorded | split_builds(tiny), key=repr)  # and a GPU's decode splits


def test_every_kernel_the_gpu_path_launches_compiles_for_sm_90(builds: list[KernelBuild]) -> None:
    assert {b.kernel for b in builds} == gpu_path_kernels()  # eight kernels, each launched
    merges = {dict(b.constexprs)["SPLITS_P"] for b in builds if b.kernel == "_decode_merge_kernel"}
    assert merges == {1, 2, 4, 8, 16, 32, 64}
    results = compile_builds(builds, SM90)
    assert len(results) == 2 * len(builds)  # each in float16 and in bfloat16
    assert [(r.build.label, r.float_type, r.error) for r in results if not r.fits(SM90)] == []
    assert {r.float_type for r in results} == {"fp16", "bf16"}
    assert {r.triton for r in results} == {triton.__version__}  # this environment's compiler


def test_a_build_that_cannot_compile_or_fit_is_reported(builds: list[KernelBuild]) -> None:
    silu = next(b for b in builds if b.kernel == "_silu_mul_kernel")
    gemm = next(b for b in builds if b.kernel == "_int4_matmul_kernel" and ("BLOCK_M", 16) in
                b.constexprs)  # fmt: skip
    odd = replace(silu, constexprs=(("BLOCK", 100),))  # tl.arange takes powers of two
    deep = dict(gemm.constexprs, BLOCK_K=1024)  # 1024-row steps, four in flight: too many
    huge = replace(gemm, constexprs=tuple(deep.items()), options=(("num_stages", 4),))
    by_kernel = {(r.build.kernel, r.float_type): r for r in compile_builds([odd, huge], SM90)}
    failed = by_kernel["_silu_mul_kernel", "bf16"]
    assert not failed.fits(SM90) and "power of 2" in failed.error and failed.shared == 0
    overflowing = by_kernel["_int4_matmul_kernel", "bf16"]
    assert not overflowing.error and overflowing.shared > SHARED_LIMIT[SM90]
    assert not overflowing.fits(SM90)


def test_a_launch_is_typed_as_triton_specializes_it() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    def kernel(x_ptr, n, m, one, big, scale, maybe, BLOCK: triton.language.constexpr):  # noqa: ANN001, N803
        pass

    x = torch.zeros(16, dtype=torch.bfloat16)
    launched = InterpretedFunction(kernel, do_not_specialize=["m"])
    args = (x, 32, 48, 1, 2**40 + 1, 0.5, None)
    build = build_of(launched, args, {"BLOCK": 64, "num_warps": 8, "grid": (1,)})
    assert build.signature == (
        ("x_ptr", "*bf16"), ("n", "i32"), ("m", "i32"), ("one", "constexpr"), ("big", "i64"),
        ("scale", "fp32"), ("maybe", "constexpr"), ("BLOCK", "constexpr"),
    )  # fmt: skip
    assert build.constexprs == (("one", 1), ("maybe", None), ("BLOCK", 64))
    assert build.divisible == ("x_ptr", "n")  # m is a multiple of 16 but kept general
    assert build.options == (("num_warps", 8),)  # the grid is the launch's, not the build's
    shifted = build_of(launched, (x[1:], *args[1:]), {"BLOCK": 64})  # 2 bytes in: not aligned
    assert shifted.divisible == ("n",)
    assert build.in_float("fp32").signature[0] == ("x_ptr", "*bf16")  # only float16 changes
