"""The page of `servelab plan`: the devices each strategy needs for a traffic, drawn from the
record the command writes (`plan.json`), its caveat first: every figure on it is predicted
from published specifications, not measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.reports.html import Page, table_html

COLUMNS = {  # a plan row's fields and their labels, in the order every table shows them
    "hardware": "hardware",
    "strategy": "strategy",
    "weight_gb": "weights (GB)",
    "kv_gb": "KV left (GB)",
    "requests_held": "requests KV holds",
    "sustained": "sustained (req/s per device)",
    "devices": "devices",
    "bound": "batch bounded by",
    "cost_per_million": "cost per 1M output tokens",
    "basis": "step times from",
}


def build_plan_report(record: dict[str, Any], out: Path) -> Path:
    """Write the plan's page to `out` and return its path."""
    page = Page(f"Devices for {record['rate']:g} req/s of {record['model']}")
    page.paragraph(str(record["caveat"]), "warn")
    if record.get("spread"):
        page.paragraph(str(record["spread"]))
    rows = [[row[key] for key in COLUMNS] + [row["note"]] for row in record["rows"]]
    page.tables([table_html([*COLUMNS.values(), "note"], rows)])
    return page.write(out)
