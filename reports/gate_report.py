"""`gate.html`: a small, self-contained page of a gate's claims with their intervals drawn.

Each claim gets one row: its statement, estimate, interval, outcome, and an inline SVG strip
showing the interval as a bar, the estimate as a dot and the bound as a dashed line, coloured
by outcome, so a claim that straddles its bound is visibly inconclusive. The page reads only
`gate.json` and needs no script and no network.
"""

from __future__ import annotations

import json
from pathlib import Path

from servelab.reports.html import STYLE, esc, fmt

COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "inconclusive": "#e69500", "refused": "#6a1b9a"}
WIDTH, HEIGHT, MARGIN = 360, 34, 12


def interval_svg(claim: dict) -> str:
    """The claim's interval, estimate and bound on a shared axis, as inline SVG."""
    if claim["estimate"] is None:
        return "<span>no value</span>"
    low, high, bound, estimate = claim["low"], claim["high"], claim["bound"], claim["estimate"]
    left, right = min(low, bound), max(high, bound)
    pad = (right - left) * 0.15 or max(abs(bound) * 0.1, 1e-9)
    left, right = left - pad, right + pad

    def x(value: float) -> float:
        return MARGIN + (value - left) / (right - left) * (WIDTH - 2 * MARGIN)

    colour = COLOURS[claim["outcome"]]
    middle = 14
    return (
        f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{esc(claim["name"])} interval">'
        f'<line x1="{MARGIN}" y1="{middle}" x2="{WIDTH - MARGIN}" y2="{middle}" '
        'stroke="#c8ced6"/>'
        f'<line x1="{x(bound):.1f}" y1="2" x2="{x(bound):.1f}" y2="{middle + 8}" '
        'stroke="#1d2733" stroke-dasharray="3,2"/>'
        f'<text x="{x(bound):.1f}" y="{HEIGHT - 1}" font-size="10" text-anchor="middle">'
        f"bound {esc(fmt(bound))}</text>"
        f'<line x1="{x(low):.1f}" y1="{middle}" x2="{x(high):.1f}" y2="{middle}" '
        f'stroke="{colour}" stroke-width="6" stroke-linecap="round"/>'
        f'<circle cx="{x(estimate):.1f}" cy="{middle}" r="4.5" fill="#fff" '
        f'stroke="{colour}" stroke-width="2"/>'
        "</svg>"
    )


def _row(claim: dict) -> str:
    outcome = claim["outcome"]
    if outcome == "inconclusive":
        outcome += f" (counts as {claim['counted']})"
    cells = [
        f'<td class="t">{esc(claim["name"])}</td>',
        f'<td class="t">{esc(claim["statement"])}</td>',
        f"<td>{esc(fmt(claim['estimate']))}</td>",
        f"<td>[{esc(fmt(claim['low']))}, {esc(fmt(claim['high']))}]</td>",
        f"<td>{claim['samples']}</td>",
        f'<td class="t" style="color:{COLOURS[claim["outcome"]]}">{esc(outcome)}</td>',
        f'<td class="t">{interval_svg(claim)}</td>',
    ]
    return "<tr>" + "".join(cells) + "</tr>"


def gate_page(record: dict) -> str:
    headers = ["claim", "statement", "estimate", f"{record['confidence']:.0%} interval", "n"]
    head = "".join(f"<th>{esc(h)}</th>" for h in [*headers, "outcome", "interval"])
    rows = "".join(_row(c) for c in record["claims"])
    notes = "".join(
        f"<li>{esc(c['name'])}: {esc(note)}</li>" for c in record["claims"] for note in c["notes"]
    )
    verdict = "passed" if record["passed"] else "failed"
    source = (
        f"runs read from {record['read_from']}" if record["read_from"] else "runs measured here"
    )
    summary = (
        f"Gate {verdict}: {len(record['runs'])} {source}, {record['repeats']} repetitions "
        f"interleaved, {record['elapsed_s']:.0f} s on machine "
        f"{record['machine']['fingerprint']} ({record['machine']['cpu']})."
    )
    title = f"gate {record['gate']}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><main>"
        f"<h1>{esc(title)}</h1><p>{esc(summary)}</p>"
        f'<p class="note">{esc(record["file"])}; an interval wholly on the claimed side of '
        "its bound passes, wholly on the wrong side fails, across it is inconclusive.</p>"
        f'<div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + "</main></body></html>\n"
    )


def build_gate_report(gate_dir: Path) -> Path:
    """Write `gate.html` beside `gate.json`; returns its path."""
    record = json.loads((gate_dir / "gate.json").read_text())
    path = gate_dir / "gate.html"
    path.write_text(gate_page(record), encoding="utf-8")
    return path
