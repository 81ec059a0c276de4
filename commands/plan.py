"""`servelab plan`: how many devices each strategy needs for a traffic, on hardware not at hand.

The arithmetic and the knee searches on simulated runs are `harness.search.plan`'s; this
verb runs them for every preset and strategy, prints the table and writes plan.json and
plan.html under `plan.out_dir`. Everything is a prediction, not a measurement, and every table
and page says so; each row says what its step times rest on: steps profiled on that GPU
(`plan.profiles`), or its published specifications and stated efficiencies.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import partial

from rich.console import Console
from rich.table import Table

from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.search.plan import (
    PlanRow,
    PlanSettings,
    basis_of,
    plan_row,
    predicted_line,
    spread_line,
)
from servelab.reports.plan_report import COLUMNS, build_plan_report
from servelab.reports.run_report import reported

SUMMARY = "devices each strategy needs for a traffic on GPU presets (simulated: a prediction)"
USAGE = """usage: servelab plan slo.ttft_s=S slo.tpot_s=T [model=dummy-llama2-13b]
       [plan.hardware=[a100-40gb,a100-80gb]] [plan.rate=R] [plan.price_per_hour=P]
       [plan.strategies=[...]] [+plan.profiles.PRESET=FILE] [workload=...] [OVERRIDE ...]

Per preset and strategy: weights, the KV memory left and the requests it holds, the
sustained rate per device (the knee search on simulated runs), the devices plan.rate req/s
needs and the cost per million output tokens. Predicted from steps profiled on a preset's
GPU (+plan.profiles.PRESET=FILE, e.g. the GPU check's step-profile.json), else from its
published specifications; each row says which."""


def _cell(row: PlanRow, key: str) -> str:
    value = getattr(row, key)
    if value is None:
        return "-"
    if key == "cost_per_million":
        return f"{value:.3g}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def render_table(rows: list[PlanRow], rate: float) -> str:
    table = Table(title=f"devices for {rate:g} req/s. {predicted_line()}")
    for label in [*COLUMNS.values(), "note"]:
        table.add_column(label)
    for row in rows:
        table.add_row(*(_cell(row, key) for key in COLUMNS), row.note)
    console = Console(record=True, width=180)
    with console.capture() as capture:
        console.print(table)
        spread = spread_line(rows, rate)
        if spread:
            console.print(spread)
    return capture.get()


def main(args: list[str]) -> None:
    node = compose(args).plan.engine
    args = [*(f"engine.{key}={value}" for key, value in node.items()), *args]  # args win
    cfg = compose(args)
    settings = PlanSettings.of(cfg)
    bases = {  # every profile checked against what it must describe, before any row
        (preset, strategy): basis_of(preset, compose([*args, f"strategy={strategy}"]), settings)
        for preset in settings.hardware
        for strategy in settings.strategies
    }
    measured = reported(partial(run, progress=False))
    rows = []
    for preset in settings.hardware:
        for strategy in settings.strategies:
            basis = bases[preset, strategy]
            print(f"plan: {strategy} on {preset} (simulated; {basis[1]})", flush=True)
            rows.append(plan_row(args, preset, strategy, settings, measured, basis))
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    model = str(cfg.model.get("name", "model"))
    record = {
        "caveat": predicted_line(),
        "model": model,
        "rate": settings.rate,
        "price_per_hour": settings.price_per_hour,
        "spread": spread_line(rows, settings.rate),
        "rows": [asdict(row) for row in rows],
    }
    (settings.out_dir / "plan.json").write_text(json.dumps(record, indent=2) + "\n")
    build_plan_report(record, settings.out_dir / "plan.html")
    print(render_table(rows, settings.rate))
    print(f"plan.json and plan.html under {settings.out_dir}")
