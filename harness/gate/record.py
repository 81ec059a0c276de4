"""`gate.json` and the terminal table: what a gate measured, decided and how long it took.

`gate.json` is the gate's public record: the file and its settings, the machine fingerprint,
every run in the order it ran with its wall time, and per claim the statement, the values of
each side per repetition, the estimate, the interval, the outcome and how it counted. The
table and the HTML page (`reports.gate_report`) are drawn from this record alone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servelab.harness.gate.collect import Measurements
from servelab.harness.gate.evaluate import ClaimResult
from servelab.harness.gate.fingerprint import Fingerprint
from servelab.harness.gate.spec import GateSpec
from servelab.harness.measure.bootstrap import Outcome

GATE_SCHEMA = 1


def claim_record(result: ClaimResult) -> dict:
    claim = result.claim
    return {
        "name": claim.name,
        "kind": claim.kind,
        "statement": claim.statement,
        "workload": claim.workload,
        "metric": claim.metric,
        "of": claim.of.label,
        "over": None if claim.over is None else claim.over.label,
        "direction": claim.direction,
        "bound": claim.bound,
        "values_of": result.values_of,
        "values_over": result.values_over,
        "estimate": result.estimate,
        "low": result.low,
        "high": result.high,
        "samples": result.samples,
        "outcome": result.outcome.value,
        "inconclusive_counts_as": claim.inconclusive,
        "counted": result.counted.value,
        "sources": result.sources,
        "notes": result.notes,
    }


def gate_record(
    spec: GateSpec,
    results: list[ClaimResult],
    data: Measurements,
    machine: Fingerprint,
    elapsed_s: float,
    root: Path,
    read_from: str | None,
) -> dict:
    return {
        "schema": GATE_SCHEMA,
        "gate": spec.name,
        "file": str(spec.path),
        "dir": str(root),
        "finished_at": datetime.now(UTC).astimezone().isoformat(),
        "elapsed_s": elapsed_s,
        "read_from": read_from,  # None: measured by this gate; else an earlier gate's directory
        "repeats": spec.repeats,
        "confidence": spec.confidence,
        "resamples": spec.resamples,
        "seed": spec.seed,
        "machine": {"fingerprint": machine.id, **machine.parts},
        "runs": [
            {
                "workload": m.slot.cell.workload,
                "strategy": m.slot.cell.side.label,
                "repetition": m.slot.repetition + 1,
                "run_dir": str(m.slot.run_dir),
                "seconds": m.seconds,
            }
            for m in data.runs
        ],
        "perplexities": [
            {"strategy": m.slot.side.label, "windows": m.slot.windows, "seconds": m.seconds}
            for m in data.perplexities
        ],
        "claims": [claim_record(r) for r in results],
        "passed": all(r.counted is Outcome.PASS for r in results),
    }


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def outcome_text(claim: dict) -> str:
    if claim["outcome"] != Outcome.INCONCLUSIVE.value:
        return claim["outcome"]
    return f"inconclusive (counts as {claim['counted']})"


def render_gate(record: dict) -> str:
    """The gate as a terminal table, with notes and totals under it."""
    confidence = f"{record['confidence']:.0%}"
    table = Table(title=f"gate {record['gate']} ({record['file']})")
    for column in ("claim", "statement", "estimate", f"{confidence} interval", "n", "outcome"):
        table.add_column(column)
    for claim in record["claims"]:
        interval = f"[{_number(claim['low'])}, {_number(claim['high'])}]"
        cells = (
            claim["name"],
            claim["statement"],
            _number(claim["estimate"]),
            interval,
            str(claim["samples"]),
            outcome_text(claim),
        )
        table.add_row(*(escape(cell) for cell in cells))
    console = Console(record=True, width=160)
    with console.capture() as capture:
        console.print(table)
    lines = [capture.get().rstrip()]
    for claim in record["claims"]:
        lines += [f"  {claim['name']}: {note}" for note in claim["notes"]]
    counts = {o.value: 0 for o in Outcome}
    for claim in record["claims"]:
        counts[claim["outcome"]] += 1
    verdict = "PASSED" if record["passed"] else "FAILED"
    source = f"read from {record['read_from']}" if record["read_from"] else "measured here"
    refused = f", {counts['refused']} refused (flagged runs)" if counts["refused"] else ""
    lines.append(
        f"gate {record['gate']} {verdict}: {counts['pass']} pass, {counts['fail']} fail, "
        f"{counts['inconclusive']} inconclusive{refused}; {len(record['runs'])} runs {source}, "
        f"{record['elapsed_s']:.0f} s; machine {record['machine']['fingerprint']}"
    )
    return "\n".join(lines)
