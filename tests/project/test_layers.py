"""The layers import downward (`scripts/import_graph.py` reads every import, in functions and
`TYPE_CHECKING` blocks too): each top-level package imports only packages below it in
`PACKAGES` (base, kernels, workloads, engine, models, strategies, harness, reports,
commands), so no import points back up; within them `kernels` and `workloads` import only
`base`, the engine and the model only `base` and the kernels; each part of the harness only
parts below it (checks < measure < run < search < serving, gate < claims), so no two import
each other, and within the run package the servers and the simulation know no backend; and no
verb imports another."""

from __future__ import annotations

from scripts.import_graph import PACKAGES, ROOT, edges, imported

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


# the harness's parts, lowest first; a part imports only parts of a lower rank (serving and
# gate are peers; claims reads the gate's)
HARNESS = {"checks": 0, "measure": 1, "run": 2, "search": 3, "serving": 4, "gate": 4,
           "claims": 5}  # fmt: skip


def test_every_part_of_the_harness_imports_only_parts_below_it() -> None:
    parts = {p.name for p in (ROOT / "harness").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert parts == set(HARNESS)  # a new part is given its place
    up = {
        (source, target): files
        for (source, target), files in edges(split_harness=True).items()
        if source.startswith("harness.") and target.startswith("harness.")
        and HARNESS[target.split(".")[1]] >= HARNESS[source.split(".")[1]]
    }  # fmt: skip
    assert up == {}


def test_no_two_parts_of_the_harness_import_each_other() -> None:
    graph = edges(split_harness=True)
    both = sorted((a, b) for (a, b) in graph if a < b and (b, a) in graph)
    assert both == [], {pair: (graph[pair], graph[pair[::-1]]) for pair in both}


def test_a_verb_imports_no_other_verb() -> None:
    """The commands share their argument helpers (`commands.config`) and nothing else: what
    two verbs both need lives in the layers below them."""
    shared = {("commands", "config")}
    borrowed = {
        path.name: sorted(".".join(m) for m in imported(path) if m[0] == "commands")
        for path in sorted((ROOT / "commands").glob("*.py"))
        if {m[:2] for m in imported(path) if m[0] == "commands"} - shared
    }
    assert borrowed == {}


# the run package's subpackages, lowest first: a backend may replay on the simulated engine;
# the servers a run starts know no backend, and the simulation neither
RUN = {"simulate": 0, "servers": 0, "backends": 1}


def test_the_run_package_s_parts_import_only_parts_below_them() -> None:
    run = ROOT / "harness" / "run"
    parts = {p.name for p in run.iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert parts == set(RUN)  # a new part is given its place
    up = {
        (part, module[2])
        for part in RUN
        for path in sorted((run / part).rglob("*.py"))
        for module in imported(path)
        if module[:2] == ("harness", "run") and len(module) > 2 and module[2] in RUN
        and module[2] != part and RUN[module[2]] >= RUN[part]
    }  # fmt: skip
    assert up == set()
