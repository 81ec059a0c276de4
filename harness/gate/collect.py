"""Carry out a gate's plan: run every slot in order, or read the slots an earlier gate ran.

Every configuration is composed and checked before the first run starts, so a bad override
fails in seconds with one line. Runs are ordinary runs (`harness.run.run.run`) into the
plan's directories. Perplexity measurements are written beside them as small JSON files with
the hash of their configuration. Reading an earlier gate's directory (`from=DIR`) accepts a
run only if it is complete and was made from exactly the configuration the plan composes
now (the summary's `config_hash`), and the same for perplexity files.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import DictConfig

from servelab.base.errors import ConfigError
from servelab.harness.gate.plan import GatePlan, PerplexitySlot, RunSlot
from servelab.harness.run.run import completed_summary
from servelab.harness.run.spec import config_hash, engine_spec


@dataclass
class RunMeasure:
    slot: RunSlot
    summary: dict
    seconds: float  # wall time of the run here (0 when read from an earlier gate)


@dataclass
class PerplexityMeasure:
    slot: PerplexitySlot
    perplexity: float
    tokens: int
    seconds: float


@dataclass
class Measurements:
    runs: list[RunMeasure]  # in the order they ran
    perplexities: list[PerplexityMeasure]

    def run_at(self, run_dir: Path) -> RunMeasure:
        return next(m for m in self.runs if m.slot.run_dir == run_dir)

    def perplexity_at(self, path: Path) -> PerplexityMeasure:
        return next(m for m in self.perplexities if m.slot.path == path)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def composed(plan: GatePlan, compose: Callable[[list[str]], DictConfig]) -> dict[Path, DictConfig]:
    """Every configuration of the plan, composed and checked before any work."""
    configs = {}
    for key, overrides in [(s.run_dir, s.overrides) for s in plan.runs] + [
        (p.path, p.overrides) for p in plan.perplexities
    ]:
        cfg = compose(list(overrides))
        engine_spec(cfg)  # every check a run makes before anything loads
        configs[key] = cfg
    return configs


def read_earlier(plan: GatePlan, configs: dict[Path, DictConfig]) -> Measurements:
    """The plan's measurements as an earlier gate left them under the same directory."""
    runs = []
    for slot in plan.runs:
        summary = completed_summary(configs[slot.run_dir], slot.run_dir)
        if summary is None:
            raise ConfigError(
                "from",
                f"{slot.run_dir} holds no complete run of this configuration; run the gate "
                "without from= to measure it",
            )
        runs.append(RunMeasure(slot, summary, 0.0))
    perplexities = []
    for slot in plan.perplexities:
        record = json.loads(slot.path.read_text()) if slot.path.is_file() else {}
        if record.get("config_hash") != config_hash(configs[slot.path]):
            raise ConfigError(
                "from",
                f"{slot.path} holds no perplexity of this configuration; run the gate "
                "without from= to measure it",
            )
        perplexities.append(PerplexityMeasure(slot, record["perplexity"], record["tokens"], 0.0))
    return Measurements(runs, perplexities)


def measure(
    plan: GatePlan, configs: dict[Path, DictConfig], run: Callable[[DictConfig, Path], dict]
) -> Measurements:
    """Run every slot in the plan's order with `run` (a configuration into its run directory,
    the summary back), then measure every perplexity."""
    from servelab.harness.run.perplexity import served_perplexity

    runs = []
    total = len(plan.runs) + len(plan.perplexities)
    for number, slot in enumerate(plan.runs, start=1):
        start = time.perf_counter()
        summary = run(configs[slot.run_dir], slot.run_dir)
        seconds = time.perf_counter() - start
        runs.append(RunMeasure(slot, summary, seconds))
        cell = slot.cell
        _log(
            f"[{number}/{total}] {cell.workload} · {cell.side.label} · rep "
            f"{slot.repetition + 1}: {seconds:.1f} s"
        )
    perplexities = []
    for number, slot in enumerate(plan.perplexities, start=len(plan.runs) + 1):
        start = time.perf_counter()
        cfg = configs[slot.path]
        result = served_perplexity(engine_spec(cfg), slot.windows, progress=False)
        seconds = time.perf_counter() - start
        slot.path.parent.mkdir(parents=True, exist_ok=True)
        record = {"config_hash": config_hash(cfg), "windows": slot.windows, **asdict(result)}
        slot.path.write_text(json.dumps(record, indent=2) + "\n")
        perplexities.append(PerplexityMeasure(slot, result.perplexity, result.tokens, seconds))
        _log(
            f"[{number}/{total}] perplexity · {slot.side.label}: {result.perplexity:.4g} "
            f"({seconds:.1f} s)"
        )
    return Measurements(runs, perplexities)
