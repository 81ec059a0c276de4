"""Whether the lock installs where users are: resolved against the public index alone.

A lock that only resolves on the machine that made it (a local wheel folder, a pip
configuration, one Python) stops every other user at their first command. This resolves
servelab with the lock as its constraints, as `make` installs it, against the index alone (uv
with no configuration, so no local wheel folder, no extra index), for each supported Python on
a Linux x86-64 platform (where PyPI serves torch's CUDA build, as on a GPU machine), reading
metadata only: nothing is installed. Each resolution must succeed and take only the lock's
pins. The GPU recipe (the wheels carried to the GPU image, `make gpu-wheels`) must have a wheel
for the image's Python. One line a target; a failure names the Python and uv's reason (which
names the package); exit 1 if any fails.

    python -m scripts.check_lock --lock requirements/lock.txt --gpu-lock requirements/gpu.txt \
        --index https://pypi.org/simple --platform x86_64-manylinux_2_28 \
        --pythons 3.11 3.12 3.13 --gpu-python 3.12
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab.harness.checks.lock import canonical_name, locked_pins

REPO = Path(__file__).resolve().parent.parent
BUILT_HERE = "antlr4-python3-runtime"  # no wheel on the index: `make gpu-wheels` builds it


@dataclass(frozen=True)
class Target:
    """One place the lock must install: a Python on a platform, with what to resolve."""

    name: str
    python: str
    requirements: tuple[str, ...]  # uv pip compile's inputs and options ("-": stdin)
    stdin: str = ""


def uv_binary() -> str:
    """The uv installed beside this Python (the lock's, in the test extra), else on PATH."""
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        sys.exit("check_lock: no uv beside this Python or on PATH (`make` installs it)")
    return found


def uv_resolve(target: Target, index: str, platform: str) -> subprocess.CompletedProcess[str]:
    """`uv pip compile` of the target against `index` alone, for its Python on `platform`."""
    command = [
        uv_binary(), "pip", "compile", "--quiet", "--no-config", "--no-python-downloads",
        "--no-header", "--no-annotate", "--index-url", index, "--python-version", target.python,
        "--python-platform", platform, *target.requirements,
    ]  # fmt: skip
    return subprocess.run(command, input=target.stdin, capture_output=True, text=True, cwd=REPO)


def pins_of(resolved: str) -> dict[str, str]:
    """The `name==version` lines of uv's answer, by canonical name."""
    pins = (line.split("==", 1) for line in resolved.splitlines() if "==" in line)
    return {canonical_name(name): version.split(";")[0].strip() for name, version in pins}


def environment(python: str) -> dict[str, str]:
    """The marker environment of CPython `python` on Linux x86-64, for the lock's markers."""
    return {
        "python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
        "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
    }  # fmt: skip


def unlocked(resolved: dict[str, str], lock_text: str, python: str) -> list[str]:
    """Each resolved distribution the lock does not pin at that version for `python`."""
    pins = locked_pins(lock_text, environment(python))
    return [
        f"{name}=={version}"
        for name, version in sorted(resolved.items())
        if name not in pins or not pins[name].specifier.contains(version, prereleases=True)
    ]


def check(target: Target, index: str, platform: str, lock_text: str | None) -> bool:
    """Resolve one target; print its line (and uv's reason on failure). True when it installs."""
    where = f"{target.name}, CPython {target.python} on {platform}"
    answer = uv_resolve(target, index, platform)
    if answer.returncode != 0:
        print(f"FAIL {where}: does not resolve from {index}")
        reason = [line for line in answer.stderr.splitlines() if line.strip()]
        print("\n".join(f"     {line}" for line in reason[-12:]))
        return False
    resolved = pins_of(answer.stdout)
    strays = unlocked(resolved, lock_text, target.python) if lock_text is not None else []
    if strays:
        print(f"FAIL {where}: resolves to distributions the lock does not pin: {', '.join(strays)}")
        return False
    shown = [f"{name} {resolved[name]}" for name in ("torch", "triton") if name in resolved]
    what = "all locked" if lock_text is not None else "each with a wheel"
    detail = f" ({', '.join(shown)})" if shown else ""
    print(f"ok   {where}: {len(resolved)} distributions, {what}{detail}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", type=Path, required=True)
    parser.add_argument("--gpu-lock", type=Path, required=True)
    parser.add_argument("--index", required=True, help="the public index, e.g. PyPI's simple API")
    parser.add_argument("--platform", required=True, help="uv's --python-platform")
    parser.add_argument("--pythons", nargs="+", required=True, help="e.g. 3.11 3.12 3.13")
    parser.add_argument("--gpu-python", required=True, help="the GPU image's Python")
    args = parser.parse_args(argv)
    for path in (args.lock, args.gpu_lock):
        if not path.is_file():
            parser.error(f"no lock at {path}")
    lock_text = args.lock.read_text()
    targets = [
        Target("the lock", python, ("--extra", "test", "-c", str(args.lock), "pyproject.toml"))
        for python in args.pythons
    ]
    wheels = [line for line in args.gpu_lock.read_text().splitlines() if "==" in line]
    carried = "\n".join(line for line in wheels if not line.startswith(BUILT_HERE))
    gpu = Target("the GPU recipe's wheels", args.gpu_python,
                 ("--no-deps", "--only-binary", ":all:", "-"), carried)  # fmt: skip
    results = [check(target, args.index, args.platform, lock_text) for target in targets]
    results.append(check(gpu, args.index, args.platform, None))
    print(f"{sum(results)} of {len(results)} targets install from {args.index} alone")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
