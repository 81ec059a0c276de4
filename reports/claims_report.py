"""`claims.html`: a self-contained page of the papers' claims, each with its measurements'
intervals drawn (the gate page's strips) and its verdict. It reads only `claims.json`."""

from __future__ import annotations

import json
from pathlib import Path

from servelab.harness.claims.record import measurement_text
from servelab.reports.gate_report import interval_svg
from servelab.reports.html import STYLE, esc

VERDICT_COLOURS = {
    "holds": "#2e7d32",
    "holds in part": "#e69500",
    "does not hold here": "#c62828",
    "not testable here": "#55606e",
    "undecided here": "#6a1b9a",
}


def _measurement_cells(measured: dict | None, not_measured: list[str]) -> str:
    if measured is None:
        names = ", ".join(not_measured)
        return f"<td>not measured (no search=DIR): {esc(names)}</td><td></td>"
    open_side = None in (measured["low"], measured["high"])
    drawn = "open interval" if open_side else interval_svg(measured)
    return f"<td>{esc(measurement_text(measured))}</td><td>{drawn}</td>"


def _claim_rows(entry: dict) -> str:
    measured: list[dict | None] = list(entry["measured"])
    if entry["not_measured"]:
        measured.append(None)
    span = len(measured)
    colour = VERDICT_COLOURS[entry["verdict"]]
    reason = entry["differs"]
    if entry["not_testable"]:
        reason = f"{entry['not_testable']} {reason}"
    head = (
        f'<td rowspan="{span}"><b>{esc(entry["paper"])}</b><br>{esc(entry["says"])}'
        f"<br><i>{esc(entry['conditions'])}</i></td>"
        f'<td rowspan="{span}">{esc(entry["figure"])}</td>'
    )
    tail = (
        f'<td rowspan="{span}" style="color:{colour}"><b>{esc(entry["verdict"])}</b>'
        f'</td><td rowspan="{span}">{esc(reason)}</td>'
    )
    rows = []
    for i, m in enumerate(measured):
        cells = _measurement_cells(m, entry["not_measured"])
        rows.append("<tr>" + (head if i == 0 else "") + cells + (tail if i == 0 else "") + "</tr>")
    return "".join(rows)


def claims_page(record: dict) -> str:
    headers = ["claim", "paper's figure", "measured here", "interval", "verdict", "what differs"]
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    rows = "".join(_claim_rows(e) for e in record["claims"])
    machine = record["machine"]
    source = f"runs read from {record['read_from']}" if record["read_from"] else "measured here"
    summary = (
        f"{len(record['claims'])} claims on machine {machine['fingerprint']} ({machine['cpu']}), "
        f"{source}: {record['repeats']} repetitions interleaved, {record['confidence']:.0%} "
        f"bootstrap intervals, {record['elapsed_s']:.0f} s. Measurements: "
        f"{record['measurements_file']}, runs in {record['gate_dir']}."
    )
    title = "The papers' claims, measured here"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><main>"
        f"<h1>{esc(title)}</h1><p>{esc(summary)}</p>"
        '<p class="note">A claim holds when every measurement passes, holds in part when some '
        "do, does not hold here when none does; a measurement passes when its whole interval "
        "lies on the claimed side of its bound (the dashed line).</p>"
        f'<div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'
        "</main></body></html>\n"
    )


def build_claims_report(claims_dir: Path) -> Path:
    """Write `claims.html` beside `claims.json`; returns its path."""
    record = json.loads((claims_dir / "claims.json").read_text())
    path = claims_dir / "claims.html"
    path.write_text(claims_page(record), encoding="utf-8")
    return path
