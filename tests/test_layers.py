"""The layers import downward (`scripts/import_graph.py` reads every import, in functions and
`TYPE_CHECKING` blocks too): `base` imports no other package, `kernels` and `workloads` only
`base`, no part of the harness below its commands imports `reports` (a run's report is
drawn by the command that asked for it) or the commands themselves. Strategies and the
engine's interfaces still import each other both ways; that arrow is not yet held here."""

from __future__ import annotations

from scripts.import_graph import edges

DOWNWARD = {"base": set(), "kernels": {"base"}, "workloads": {"base"}}


def test_the_lower_layers_import_only_below_them() -> None:
    graph = edges()
    for package, allowed in DOWNWARD.items():
        imports = {target for (source, target) in graph if source == package}
        assert imports <= allowed, (package, {t: graph[(package, t)] for t in imports - allowed})


def test_only_the_commands_import_the_reports() -> None:
    up = {
        source: files
        for (source, target), files in edges(split_harness=True).items()
        if target == "reports" and source.startswith("harness.") and source != "harness.commands"
    }
    assert up == {}


def test_nothing_below_the_commands_imports_them() -> None:
    up = {
        source: files
        for (source, target), files in edges(split_harness=True).items()
        if target == "harness.commands" and source != "harness.commands"
    }
    assert up == {}
