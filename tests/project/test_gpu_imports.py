"""The GPU recipe brings what servelab imports: every third-party distribution the package,
the check's scripts and its benchmarks import, and what each needs in turn, is on the GPU
machine's image (`requirements/gpu-image.txt`, read off that machine) or among the recipe's
wheels (`requirements/gpu.txt`, `make gpu-wheels`). Runs on any machine: the imports are read
from the source, the requirements from this environment's installed metadata."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
IMPORTERS = ["harness", "strategies", "kernels", "workloads", "reports", "src", "benchmarks"]
LOCAL = ("servelab", "scripts", "tests", "benchmarks")  # this tree's own top-level names
# the GPU machine's interpreter, for the requirements' environment markers
GPU_MARKERS = {
    "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
}  # fmt: skip


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path: Path) -> set[str]:
    """Distribution names of a list or a lock: one a line, `name` or `name==version`."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {canonical(re.split(r"[=<>~!\[; ]", line)[0]) for line in lines if line}


def source_files() -> list[Path]:
    files = [path for folder in IMPORTERS for path in (ROOT / folder).rglob("*.py")]
    files += sorted((ROOT / "scripts").glob("*.py"))  # the check's own; not peers/
    return [path for path in files if "published" not in path.parts]


def imported_modules(files: list[Path]) -> dict[str, Path]:
    """Each third-party top-level module imported, with one file that imports it."""
    found: dict[str, Path] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL:
                    found.setdefault(top, path)
    return found


def needed(distribution: str, image: set[str], seen: set[str]) -> set[str]:
    """A distribution and, unless the image has it, what it requires on the GPU machine."""
    name = canonical(distribution)
    if name in seen:
        return set()
    seen.add(name)
    if name in image:
        return {name}
    found = {name}
    for line in metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(GPU_MARKERS):
            found |= needed(requirement.name, image, seen)
    return found


def test_every_distribution_servelab_imports_reaches_the_gpu_machine() -> None:
    image = listed(ROOT / "requirements" / "gpu-image.txt")
    recipe = listed(ROOT / "requirements" / "gpu.txt")
    owners = metadata.packages_distributions()
    modules = imported_modules(source_files())
    unowned = sorted(f"{m} ({p.relative_to(ROOT)})" for m, p in modules.items() if m not in owners)
    assert not unowned, f"imported but installed by no distribution: {unowned}"
    seen: set[str] = set()
    wanted = set().union(*(needed(owners[m][0], image, seen) for m in modules))
    missing = sorted(wanted - image - recipe)
    assert not missing, f"neither on the GPU image nor in the recipe (make gpu-wheels): {missing}"


def test_the_check_finds_what_it_is_built_to_find() -> None:
    """A package that imports what the image lacks is caught, and so is its own requirement."""
    image = listed(ROOT / "requirements" / "gpu-image.txt")
    assert "fastapi" not in image and "torch" in image
    wanted = needed("fastapi", image, set())
    assert {"fastapi", "starlette", "pydantic"} <= wanted
    assert Marker('python_version < "3.11"').evaluate(GPU_MARKERS) is False
