"""`servelab claims`: the papers' headline claims beside what this machine measures for them.

A claims file (`conf/claims/papers.yaml`) states each claim with the paper's words, figure and
conditions, and names the measurements that test it: claims of a gate file
(`conf/claims/measurements.yaml`), so the runs are the gate's (repeated, strategies
interleaved, a bootstrap interval per ratio) and `from=DIR` reuses an earlier claims or gate
run instead of measuring again. Writes `claims.json`, `claims.md` and a self-contained
`claims.html` beside the gate's `gate.json`, and prints the table.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from harness.claims.papers import parse_claims_file, read_measurements_path
from harness.claims.record import claims_markdown, claims_record, render_claims
from harness.commands.gate import GateArgs, run_gate
from harness.errors import ConfigError
from harness.gate.fingerprint import machine_fingerprint
from harness.gate.spec import load_gate
from harness.measure.rundir import write_json_atomic
from reports.claims_report import build_claims_report

SUMMARY = "the papers' claims beside what this machine measures for them, with verdicts"
USAGE = """usage: servelab claims [claims=FILE] [out=DIR] [from=DIR] [repeats=N] [OVERRIDE ...]

Measures what the claims file's measurements (a gate file) need into out=DIR (default
runs/claims/NAME/DATE-TIME), or reads an earlier claims or gate run from=DIR; then gives each
claim its measurements with intervals and a verdict (holds, holds in part, does not hold
here, not testable here) and writes claims.json, claims.md and claims.html.
FILE defaults to conf/claims/papers.yaml. OVERRIDEs apply to every run."""

DEFAULT_FILE = Path("conf/claims/papers.yaml")
OWN_KEYS = ("claims", "out", "from", "repeats")


def parse_args(args: list[str]) -> tuple[Path, GateArgs]:
    """The claims file and the gate arguments its measurements run with."""
    own: dict[str, str] = {}
    overrides = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key in OWN_KEYS:
            own[key] = value
        else:
            overrides.append(arg)
    path = Path(own.get("claims", DEFAULT_FILE))
    repeats = own.get("repeats")
    if repeats is not None and not (repeats.isdigit() and int(repeats) >= 2):
        raise ConfigError("repeats", f"{repeats!r} must be a whole number, at least 2")
    read_from = Path(own["from"]) if "from" in own else None
    if read_from is not None and not read_from.is_dir():
        raise ConfigError("from", f"{read_from} is not a directory of an earlier claims run")
    stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    out = Path(own["out"]) if "out" in own else Path("runs/claims") / path.stem / stamp
    gate = GateArgs(
        path=read_measurements_path(path),
        out=out,
        read_from=read_from,
        repeats=None if repeats is None else int(repeats),
        inconclusive=None,
        overrides=overrides,
    )
    return path, gate


def run_claims(path: Path, gate_args: GateArgs) -> dict:
    """Check the claims file (and its measurements) before any work, measure or read, and
    write the record and its pages into the gate's directory; returns the record."""
    start = time.perf_counter()
    measurements = load_gate(gate_args.path, machine_fingerprint())
    claims = parse_claims_file(path.read_text(), path, {c.name for c in measurements.claims})
    gate = run_gate(gate_args)
    record = claims_record(claims, gate, time.perf_counter() - start)
    out = Path(gate["dir"])
    write_json_atomic(out / "claims.json", record)
    (out / "claims.md").write_text(claims_markdown(record), encoding="utf-8")
    build_claims_report(out)
    return record


def main(args: list[str]) -> None:
    path, gate_args = parse_args(args)
    record = run_claims(path, gate_args)
    print(render_claims(record))
    print(f"claims.json, claims.md and claims.html in {record['gate_dir']}")
