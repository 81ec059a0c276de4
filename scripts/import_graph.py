"""Which top-level packages import which: every `servelab.<package>` import in the code of
each layer folder (inside functions and `TYPE_CHECKING` blocks too), counted by the pair of
packages, with harness's own subpackages apart (`--harness`). `tests/project/test_layers.py` holds
the layering to it.

    python -m scripts.import_graph [--harness]
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (  # lowest first: each may import only those before it
    "base", "kernels", "workloads", "engine", "models", "strategies", "harness", "reports",
    "commands",
)  # fmt: skip


def package_of(parts: tuple[str, ...], split_harness: bool) -> str:
    """The package a module (`harness.measure.x` as its parts) is in."""
    if (
        split_harness
        and len(parts) > 1
        and parts[0] == "harness"
        and (ROOT / "harness" / parts[1]).is_dir()
    ):
        return f"harness.{parts[1]}"
    return parts[0]


def imported(path: Path) -> set[tuple[str, ...]]:
    """The servelab modules a file imports, each as its dotted parts after `servelab`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = tuple(name.split("."))
            if parts[0] == "servelab" and len(parts) > 1:
                found.add(parts[1:])
    return found


def edges(split_harness: bool = False) -> dict[tuple[str, str], set[str]]:
    """(importing package, imported package) -> the importing files, across packages only."""
    graph: dict[tuple[str, str], set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            source = package_of(relative.with_suffix("").parts, split_harness)
            for module in imported(path):
                target = package_of(module, split_harness)
                if target != source and target.split(".")[0] in PACKAGES:
                    graph[(source, target)].add(str(relative))
    return dict(graph)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", action="store_true", help="harness's subpackages apart")
    args = parser.parse_args()
    for (source, target), files in sorted(edges(args.harness).items()):
        print(f"{source:>18} -> {target:<18} {len(files):4d} files")


if __name__ == "__main__":
    main()
