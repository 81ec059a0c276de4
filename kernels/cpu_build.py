"""The compiled CPU operators (`kernels/cpu/*.cpp`): one build per ISA level, and which one runs.

Each level of `kernels.capabilities` has its own build, compiled with that level's flags
(never `-march=native`, so a build is the same on every CPU of its level) and cached on disk
by a hash of the sources, the flags and torch's version; a build found there is loaded
whichever checkout or environment made it. Each registers its operators under
its own namespace (`torch.ops.servelab_avx2`, ...; `kernels/cpu/ops_library.h`), so one
process can load every build this CPU runs: the engine takes the build of the level
dispatch uses (`cpu_ops()`), and the tests run every kernel against each runnable build
(`cpu_ops(level)`) next to the PyTorch references. A build above this CPU's level is never
loaded (its code would fault); `compile_check` compiles it without loading, so its branches
are at least compiled on every machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import platform
import subprocess
import sysconfig
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch

from servelab.kernels.capabilities import LEVELS, capabilities, native_levels, runnable_levels

CPU_DIR = Path(__file__).resolve().parent / "cpu"
SOURCES = tuple(sorted(CPU_DIR.glob("*.cpp")))
HEADERS = tuple(sorted(CPU_DIR.glob("*.h")))
# -march per level on x86-64: the psABI's levels, plus what the fast branches test for
X86_LEVEL_FLAGS = {
    "baseline": ("-march=x86-64", "-mtune=generic"),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4",),
    "avx512-bf16": ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vbmi"),
}
COMMON_FLAGS = ("-O3", "-fno-math-errno", "-fopenmp", "-fvisibility=hidden")

log = logging.getLogger(__name__)


def namespace(level: str) -> str:
    """The operator namespace of a level's build: `servelab_avx512_bf16` for `avx512-bf16`."""
    return "servelab_" + level.replace("-", "_")


def level_flags(level: str) -> tuple[str, ...]:
    """The compiler flags of a level's build (no ISA flags off x86-64: there is one level)."""
    if level not in LEVELS:
        raise ValueError(f"unknown ISA level {level!r}; one of {', '.join(LEVELS)}")
    isa = X86_LEVEL_FLAGS[level] if platform.machine() in ("x86_64", "AMD64") else ()
    return (*COMMON_FLAGS, *isa, f"-DSERVELAB_OPS={namespace(level)}")


def build_name(level: str) -> str:
    """The cached build's name: the level and a hash of everything that changes its code."""
    code = "".join(path.name + path.read_text() for path in (*SOURCES, *HEADERS))
    key = " ".join((torch.__version__, *level_flags(level), code))
    return f"{namespace(level)}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


_LOCKS: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_BUILT: dict[str, str | None] = {}


def build_status(level: str) -> str | None:
    """Build (once per process; cached on disk across runs) and load a level's operators.
    None when they are available, else why not. Thread-safe: `prebuild` may be building it;
    once known, the answer is read without the lock (every linear layer's forward asks)."""
    if level in _BUILT:
        return _BUILT[level]
    with _LOCKS["build", level]:
        if level not in _BUILT:
            _BUILT[level] = _build(level)
        return _BUILT[level]


def _build(level: str) -> str | None:
    if level not in native_levels():
        return f"{level} code does not run on this CPU (its level is {native_levels()[-1]})"
    from torch.utils.cpp_extension import load

    name = build_name(level)
    build_dir = extensions_root() / "servelab" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = level_flags(level)
    try:
        with _exclusive(build_dir.with_name(f"{name}.building")):
            _remove_orphaned_baton(build_dir / "lock")
            if _load_built(build_dir / f"{name}.so"):
                return None
            load(
                name=name,
                sources=[str(path) for path in SOURCES],
                build_directory=str(build_dir),
                extra_cflags=list(flags),
                extra_ldflags=["-fopenmp"],
                is_python_module=False,
                verbose=False,
            )
    except (OSError, RuntimeError, ImportError) as exc:
        log.warning("the CPU operators for %s could not be built: %s", level, exc)
        return f"{type(exc).__name__}: {exc}"
    return None


def _load_built(library: Path) -> bool:
    """Load a build made before, by whichever checkout and environment: its name hashes
    everything that changes its code, while torch's build would compile it all again for a
    new environment (its include paths are part of every compile command). False when there
    is none, or it does not load (a build killed while linking): then it is built."""
    if not library.exists():
        return False
    try:
        torch.ops.load_library(str(library))
    except OSError as exc:
        log.warning("rebuilding %s, which did not load: %s", library.name, exc)
        library.unlink(missing_ok=True)
        return False
    return True


def cpu_ops(level: str | None = None) -> object | None:
    """The operator namespace of `level`'s build (default: the level dispatch uses), or None
    where it cannot be built (no compiler)."""
    level = level or capabilities().level
    if build_status(level) is not None:
        return None
    return getattr(torch.ops, namespace(level))


def active_build_status() -> str | None:
    """`build_status` of the level dispatch uses."""
    return build_status(capabilities().level)


def compile_check(level: str) -> str | None:
    """Compile every source at `level` without linking or loading it (for the levels above
    this CPU's: their branches are compiled here, though only a CPU of that level runs them).
    None when every source compiled (remembered on disk for these sources), else the
    compiler's output."""
    lock = extensions_root() / "servelab" / f"{build_name(level)}.compiling"
    with _LOCKS["check", level], _exclusive(lock):  # another process may compile them too
        return _compile_check(level)


def _compile_check(level: str) -> str | None:
    from torch.utils.cpp_extension import include_paths

    stamp = extensions_root() / "servelab" / f"{build_name(level)}.compiled"
    if stamp.exists():
        return None
    includes = [f"-I{path}" for path in (*include_paths(), sysconfig.get_paths()["include"])]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    compiler = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory() as out:
        procs = [
            subprocess.Popen(
                ["nice", "-n", "10", compiler, "-std=c++20", "-fPIC", abi, *level_flags(level)]
                + includes
                + ["-c", str(source), "-o", f"{out}/{source.stem}.o"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for source in SOURCES
        ]
        outputs = [proc.communicate()[0] for proc in procs]
    failed = [out for proc, out in zip(procs, outputs, strict=True) if proc.returncode]
    if failed:
        return "".join(failed)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    return None


def prebuild() -> threading.Thread:
    """Start building, in the background, every build this CPU runs (the one dispatch uses
    first) and compiling every other: a test session starts it, so the builds overlap the
    tests that need none (each build takes about a minute on two cores)."""
    active = capabilities().level
    ordered = [active, *(level for level in runnable_levels() if level != active)]

    def work() -> None:
        for level in ordered:
            build_status(level)
        for level in levels_not_run():
            compile_check(level)

    thread = threading.Thread(target=work, name="servelab-prebuild", daemon=True)
    thread.start()
    return thread


def extensions_root() -> Path:
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache/torch_extensions"))


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` across processes; the kernel drops it when its holder
    dies, however it dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def _remove_orphaned_baton(baton: Path) -> None:
    """torch's build waits for as long as its `lock` file exists, and a build killed midway
    (Ctrl-C, a timeout) leaves it behind. Under `_exclusive`, no live process is building this
    directory, so a baton there was orphaned: remove it rather than wait forever."""
    if baton.exists():
        log.warning("removing %s, left by a build that did not finish", baton)
        baton.unlink(missing_ok=True)


def levels_not_run() -> tuple[str, ...]:
    """The levels whose builds are compiled here but never run (above this CPU's level)."""
    return tuple(level for level in LEVELS if level not in native_levels())
