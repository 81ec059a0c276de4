"""What a gate must measure, in which order, and where each measurement is kept.

Every (workload, strategy) pair a claim reads is one cell. A cell that a `metric` claim reads
runs `repeats` times; one that only `identical` claims read is deterministic and runs once.
Runs are interleaved: repetition 1 runs every cell once, then repetition 2, and so on, with
the order of the cells reversed on every other repetition (A B C, C B A, A B C, ...), so
that a drift of the machine's speed during the gate falls on every strategy alike instead of
always favouring the one that runs first. Perplexity, which depends on no timing, is
measured once per (strategy, windows).

Layout under the gate's directory: `WORKLOAD/STRATEGY/rep-N/` (one run directory each) and
`perplexity/STRATEGY-wN.json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.gate.spec import GateSpec, Side


@dataclass(frozen=True)
class Cell:
    """One workload under one strategy, run `repeats` times."""

    workload: str
    side: Side
    repeats: int


@dataclass(frozen=True)
class RunSlot:
    """One run of the plan: its cell, its repetition (from 0), its directory and config."""

    cell: Cell
    repetition: int
    run_dir: Path
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class PerplexitySlot:
    side: Side
    windows: int
    path: Path
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class GatePlan:
    runs: tuple[RunSlot, ...]  # in the order they run
    perplexities: tuple[PerplexitySlot, ...]

    def runs_of(self, workload: str, side: Side) -> list[RunSlot]:
        """The runs of one cell, in repetition order."""
        slots = [s for s in self.runs if (s.cell.workload, s.cell.side) == (workload, side)]
        return sorted(slots, key=lambda s: s.repetition)

    def perplexity_of(self, side: Side, windows: int) -> PerplexitySlot:
        return next(p for p in self.perplexities if (p.side, p.windows) == (side, windows))


def slug(label: str) -> str:
    """A directory name for a side: `vllm strategy.heads=mqa` -> `vllm_strategy.heads-mqa`."""
    return "_".join(re.sub(r"[^A-Za-z0-9._]+", "-", word.lstrip("+~")) for word in label.split())


def cells_of(spec: GateSpec) -> list[Cell]:
    """Every cell the claims read, in the order claims name them, with its repetitions."""
    repeats: dict[tuple[str, Side], int] = {}
    for claim in spec.claims:
        if claim.kind == "perplexity" or claim.workload is None:
            continue
        times = spec.repeats if claim.kind == "metric" else 1
        for side in (claim.of, claim.over):
            if side is not None:
                key = (claim.workload, side)
                repeats[key] = max(repeats.get(key, 0), times)
    return [Cell(workload, side, times) for (workload, side), times in repeats.items()]


def plan_gate(spec: GateSpec, root: Path, extra: list[str]) -> GatePlan:
    """The runs (interleaved) and perplexity measurements `spec` needs, under `root`;
    `extra` overrides (from the command line) apply to every one of them, last."""
    cells = cells_of(spec)
    runs = []
    for repetition in range(max((c.repeats for c in cells), default=0)):
        due = [c for c in cells if c.repeats > repetition]
        for cell in reversed(due) if repetition % 2 else due:
            overrides = (
                *spec.overrides,
                *spec.workloads[cell.workload],
                *cell.side.overrides,
                *extra,
            )
            run_dir = root / cell.workload / slug(cell.side.label) / f"rep-{repetition + 1}"
            runs.append(RunSlot(cell, repetition, run_dir, overrides))
    perplexities: dict[tuple[Side, int], PerplexitySlot] = {}
    for claim in spec.claims:
        if claim.kind != "perplexity":
            continue
        for side in (claim.of, claim.over):
            if side is not None and (side, claim.windows) not in perplexities:
                path = root / "perplexity" / f"{slug(side.label)}-w{claim.windows}.json"
                overrides = (*spec.overrides, *side.overrides, *extra)
                perplexities[(side, claim.windows)] = PerplexitySlot(
                    side, claim.windows, path, overrides
                )
    plan = GatePlan(tuple(runs), tuple(perplexities.values()))
    check_distinct_paths(plan)
    return plan


def check_distinct_paths(plan: GatePlan) -> None:
    """Two strategies whose labels map to one directory name would overwrite each other."""
    owners: dict[Path, str] = {}
    places = [(s.run_dir, s.cell.side.label) for s in plan.runs]
    places += [(p.path, p.side.label) for p in plan.perplexities]
    for path, label in places:
        if owners.setdefault(path, label) != label:
            raise ConfigError(
                "claims", f"{label!r} and {owners[path]!r} share {path}; write one differently"
            )
