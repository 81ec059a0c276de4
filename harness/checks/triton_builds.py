"""The Triton kernel builds a stretch of code launches, and whether each compiles for a CUDA
GPU, checked on any machine.

A Triton kernel is compiled when it first launches on a GPU, so a kernel that cannot compile
there (a type error, a tile `tl.dot` refuses, more shared memory than a multiprocessor has)
fails only where GPU time is scarce. Triton compiles for a named architecture without one (its
own LLVM and `ptxas`), so: `record_builds` notes, under the interpreter, every distinct build
the code launches (kernel, argument types, constexprs, launch options, and what Triton's JIT
specializes on: integers of 1, integers and addresses that are multiples of 16, here as the
CPU's tensors have them), and `compile_builds` compiles each for an architecture, in a child
process that imports triton without the interpreter, and reads its shared memory against the
architecture's limit. The interpreter
computes bfloat16 wrongly, so code runs there in float16 and each float16 build is compiled
for every float type in `FLOATS`: the kernels are generic in it.

    python -m servelab.harness.checks.triton_builds --arch 90 < builds.json   # the child
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from servelab.harness.checks.launches import on_triton_launch

# shared memory one block may take, by compute capability (CUDA's programming guide)
SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
FLOATS = ("fp16", "bf16")
TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
         torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64",
         torch.bool: "i1"}  # fmt: skip
LAUNCH_ONLY = ("grid", "warmup")  # launch keywords that are not compile options


@dataclass(frozen=True)
class KernelBuild:
    """One compilation of a kernel, specialized as Triton's JIT specializes a launch: its
    parameters' Triton types in order ("constexpr" for a compile-time one, and for an integer
    of 1), the constexprs' values, the parameters known to be multiples of 16 (an integer, or a
    pointer's address: loads and stores vectorize on it) and the compile options (warps,
    stages)."""

    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    divisible: tuple[str, ...]
    options: tuple[tuple[str, Any], ...]

    def in_float(self, float_type: str) -> KernelBuild:
        """The same build with its float16 pointers of `float_type`."""
        return replace(
            self, signature=tuple((n, t.replace("fp16", float_type)) for n, t in self.signature)
        )

    @property
    def label(self) -> str:
        """The kernel, its constexprs, and its parameters not known to be multiples of 16."""
        odd = [n for n, t in self.signature if t[0] in "*iu" and n not in self.divisible]
        constexprs = ", ".join(f"{n}={v}" for n, v in self.constexprs)
        return f"{self.kernel}({constexprs}) not x16: {', '.join(odd) or '-'}"


@dataclass(frozen=True)
class Compiled:
    """What compiling one (recorded) build for an architecture in `float_type` ("" where it
    takes none) gave: the shared memory it takes and its warps, or the compiler's error."""

    build: KernelBuild
    float_type: str
    triton: str  # the version that compiled it
    shared: int = 0
    warps: int = 0
    error: str = ""

    def fits(self, arch: int) -> bool:
        return not self.error and self.shared <= SHARED_LIMIT[arch]


def build_of(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelBuild:
    """The build a launch of `kernel` (an interpreted kernel: its Python function `fn` and
    its `jit` keywords) with these arguments compiles."""
    fn = kernel.fn
    parameters = inspect.signature(fn).parameters
    general = {
        name if isinstance(name, str) else list(parameters)[name]
        for name in kernel.kwargs.get("do_not_specialize") or ()
    }
    bound = dict(zip(parameters, args, strict=False))
    bound.update((k, v) for k, v in kwargs.items() if k in parameters)
    signature, constexprs, divisible = [], [], []
    for name, parameter in parameters.items():
        value = bound.get(name, parameter.default)
        specialized = name not in general
        one = specialized and type(value) is int and value == 1
        if "constexpr" in str(parameter.annotation) or value is None or one:
            signature.append((name, "constexpr"))
            constexprs.append((name, value))
            continue
        signature.append((name, _triton_type(name, value)))
        if specialized and _multiple_of_16(value):
            divisible.append(name)
    options = sorted(
        (k, v) for k, v in kwargs.items() if k not in parameters and k not in LAUNCH_ONLY
    )
    return KernelBuild(
        fn.__module__, fn.__name__, tuple(signature), tuple(constexprs), tuple(divisible),
        tuple(options),
    )  # fmt: skip


def _multiple_of_16(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return type(value) is int and value % 16 == 0


def _triton_type(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "u1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"{name}: a launch argument of type {type(value).__name__}")


@contextlib.contextmanager
def record_builds() -> Iterator[set[KernelBuild]]:
    """The distinct builds the code inside launches (under the interpreter); fills as it runs."""
    builds: set[KernelBuild] = set()

    def seen(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        builds.add(build_of(kernel, args, kwargs))

    with on_triton_launch(seen):
        yield builds


def compile_builds(
    builds: list[KernelBuild], arch: int, triton_from: Path | None = None
) -> list[Compiled]:
    """Each build compiled for compute capability `arch` in every float type it takes, in a
    child process that imports triton without the interpreter (from `triton_from` where given:
    a folder holding another version, as `pip install --target` makes one)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_from is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(triton_from), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", __name__, "--arch", str(arch)],
        input=json.dumps([asdict(b) for b in builds]), capture_output=True, text=True,
        env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"compiling for sm_{arch} failed: {done.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return [Compiled(builds[row.pop("index")], **row) for row in rows]


def ptxas_missing() -> str | None:
    """Why Triton cannot compile for a CUDA GPU here, or None where it can."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if os.environ.get("TRITON_PTXAS_PATH") or ptxas.exists():
        return None
    return f"triton {triton.__version__} brings no ptxas ({ptxas}) and TRITON_PTXAS_PATH is unset"


def _compile(build: KernelBuild, float_type: str, arch: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(build.module), build.kernel)
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError(f"{build.kernel} was built for the interpreter (TRITON_INTERPRET)")
    typed = dict(build.in_float(float_type).signature)
    names = kernel.arg_names
    source = ASTSource(
        kernel,
        {name: typed[name] for name in names},
        {(names.index(name),): value for name, value in build.constexprs},
        {(names.index(name),): [["tt.divisibility", 16]] for name in build.divisible},
    )
    try:
        out = triton.compile(
            source, target=GPUTarget("cuda", arch, 32), options=dict(build.options)
        )
    except Exception as error:  # noqa: BLE001 - the compiler's error is the answer
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
        where = f"{lines[0]} " if len(lines) > 1 else ""  # a CompilationError's "at 3:38:"
        return {"shared": 0, "warps": 0, "error": f"{type(error).__name__}: {where}{lines[-1]}"}
    return {"shared": out.metadata.shared, "warps": out.metadata.num_warps, "error": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description="compile builds (JSON on stdin) for a GPU")
    parser.add_argument("--arch", type=int, choices=sorted(SHARED_LIMIT), default=90)
    arch = parser.parse_args().arch
    import triton

    for index, row in enumerate(json.load(sys.stdin)):  # each answered by one JSON line a float
        build = KernelBuild(
            row["module"], row["kernel"],
            *(tuple(map(tuple, row[k])) for k in ("signature", "constexprs")),
            tuple(row["divisible"]), tuple(map(tuple, row["options"])),
        )  # fmt: skip
        takes_float = any("fp16" in t for _, t in build.signature)
        for float_type in FLOATS if takes_float else ("",):
            made = {"index": index, "float_type": float_type, "triton": triton.__version__}
            print(json.dumps({**made, **_compile(build, float_type or "fp16", arch)}), flush=True)


if __name__ == "__main__":
    main()
