"""`claims.json`, `claims.md` and the terminal table: each paper's claim beside what this
machine measured for it, with the intervals and a verdict.

The record is built from a claims file and the gate record of its measurements
(`harness.gate.record`), so every figure in it points back to runs that can be opened; the
Markdown and the HTML page (`reports.claims_report`) are drawn from the record alone.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table

from servelab.harness.claims.papers import ClaimsFile, verdict_of
from servelab.harness.gate.record import outcome_text
from servelab.harness.measure.bootstrap import Outcome

CLAIMS_SCHEMA = 1


def measurement_text(measured: dict) -> str:
    """One measurement in a line: `output_throughput orca / fastertransformer on online >= 1:
    2.08 [2.02, 2.16], pass`."""
    estimate, low, high = (
        "?" if measured[key] is None else f"{measured[key]:.3g}"
        for key in ("estimate", "low", "high")
    )
    bounded = measured["low"] is not None or measured["high"] is not None
    value = f"{estimate} [{low}, {high}]" if bounded else "no value"
    return f"{measured['statement']}: {value}, {outcome_text(measured)}"


def measured_lines(entry: dict) -> list[str]:
    """A claim's measurements, a line each, then those not measured (no search given)."""
    lines = [measurement_text(m) for m in entry["measured"]]
    if entry["not_measured"]:
        lines.append(f"not measured (no search=DIR): {', '.join(entry['not_measured'])}")
    return lines


def claims_record(
    claims: ClaimsFile, gate: dict, knees: list[dict], search_dir: str | None, elapsed_s: float
) -> dict:
    """Every paper claim with its measurements (the gate record's entries and the knee
    measurements read from `search_dir`) and verdict; a knee measurement not read (no
    search given) is listed as not measured and left out of the verdict."""
    by_name = {c["name"]: c for c in [*gate["claims"], *knees]}
    entries = []
    for claim in claims.claims:
        measured = [by_name[name] for name in claim.measured if name in by_name]
        outcomes = [Outcome(m["outcome"]) for m in measured]
        entries.append(
            {
                "name": claim.name,
                "paper": claim.paper,
                "says": claim.says,
                "figure": claim.figure,
                "conditions": claim.conditions,
                "differs": claim.differs,
                "not_testable": claim.not_testable,
                "verdict": verdict_of(claim, outcomes).value,
                "measured": measured,
                "not_measured": [name for name in claim.measured if name not in by_name],
            }
        )
    return {
        "schema": CLAIMS_SCHEMA,
        "claims_file": str(claims.path),
        "measurements_file": str(claims.measurements),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": elapsed_s,
        "gate_dir": gate["dir"],
        "search_dir": search_dir,
        "read_from": gate["read_from"],
        "machine": gate["machine"],
        "confidence": gate["confidence"],
        "repeats": gate["repeats"],
        "claims": entries,
    }


def claims_markdown(record: dict) -> str:
    """The table of claims as Markdown, for a README or an issue."""
    machine = record["machine"]
    lines = [
        f"# Papers' claims, measured on {machine['cpu']}",
        "",
        f"Machine {machine['fingerprint']}; every ratio of strategies measured side by side, "
        f"{record['repeats']} repetitions interleaved, {record['confidence']:.0%} bootstrap "
        f"intervals; {record['elapsed_s']:.0f} s; measurements in `{record['gate_dir']}`.",
        "",
        "| claim | paper's figure | measured here | verdict | what differs |",
        "|---|---|---|---|---|",
    ]
    for entry in record["claims"]:
        measured = "<br>".join(measured_lines(entry))
        reason = entry["differs"]
        if entry["not_testable"]:
            reason = f"{entry['not_testable']} {reason}"
        lines.append(
            f"| {entry['paper']} | {entry['figure']} | {measured} | **{entry['verdict']}** "
            f"| {reason} |"
        )
    return "\n".join(lines) + "\n"


def render_claims(record: dict) -> str:
    table = Table(title=f"the papers' claims on {record['machine']['cpu']}")
    for column in ("claim", "paper's figure", "measured here", "verdict"):
        table.add_column(column)
    for entry in record["claims"]:
        measured = "\n".join(measured_lines(entry))
        table.add_row(entry["paper"], entry["figure"], measured, entry["verdict"])
    console = Console(record=True, width=160)
    with console.capture() as capture:
        console.print(table)
    return capture.get()
