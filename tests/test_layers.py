"""The layers import downward (`scripts/import_graph.py` reads every import, in functions and
`TYPE_CHECKING` blocks too): each top-level package imports only packages below it in
`PACKAGES` (base, kernels, workloads, engine, models, strategies, harness, reports,
commands), so no import points back up; within them `kernels` and `workloads` import only
`base`, the engine and the model only `base` and the kernels, and nothing in the harness
imports `reports` (a run's report is drawn by the command that asked for it)."""

from __future__ import annotations

from scripts.import_graph import PACKAGES, edges

ALLOWED = {
    "base": set(),
    "kernels": {"base"},
    "workloads": {"base"},
    "engine": {"base", "kernels"},
    "models": {"base", "kernels"},
}


def test_no_package_imports_one_above_it() -> None:
    up = {
        (source, target): files
        for (source, target), files in edges().items()
        if PACKAGES.index(target) > PACKAGES.index(source)
    }
    assert up == {}


def test_the_lowest_layers_import_only_what_they_need() -> None:
    graph = edges()
    for package, allowed in ALLOWED.items():
        imports = {target for (source, target) in graph if source == package}
        assert imports <= allowed, (package, {t: graph[(package, t)] for t in imports - allowed})
