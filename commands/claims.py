"""`servelab claims`: the papers' headline claims beside what this machine measures for them.

A claims file (`conf/claims/papers.yaml`) states each claim with the paper's words, figure and
conditions, and names the measurements that test it: claims of a gate file
(`conf/claims/measurements.yaml`), so the runs are the gate's (repeated, strategies
interleaved, a bootstrap interval per ratio) and `from=DIR` reuses an earlier claims or gate
run instead of measuring again; sustained-rate ratios are read from a knee search already run
(`search=DIR`, `harness.claims.knees`). Writes `claims.json`, `claims.md` and a self-contained
`claims.html` beside the gate's `gate.json`, and prints the table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.claims.knees import knee_measurement, read_knees
from servelab.harness.claims.papers import parse_claims_file, read_measurements_path
from servelab.harness.claims.record import claims_markdown, claims_record, render_claims
from servelab.harness.gate.fingerprint import machine_fingerprint
from servelab.harness.gate.run import GateArgs, run_gate
from servelab.harness.gate.spec import load_gate
from servelab.harness.measure.rundir import write_json_atomic
from servelab.reports.claims_report import build_claims_report
from servelab.reports.gate_report import build_gate_report
from servelab.reports.run_report import reported

SUMMARY = "the papers' claims beside what this machine measures for them, with verdicts"
USAGE = """usage: servelab claims [claims=FILE] [out=DIR] [from=DIR] [repeats=N] [search=DIR]
                      [OVERRIDE ...]

Measures what the claims file's measurements (a gate file) need into out=DIR (default
runs/claims/NAME/DATE-TIME), or reads an earlier claims or gate run from=DIR; then gives each
claim its measurements with intervals and a verdict (holds, holds in part, does not hold
here, not testable here) and writes claims.json, claims.md and claims.html. Sustained-rate
measurements (the file's `knees:`) are read from a knee search's directory search=DIR (e.g.
make run's runs/comparison/DATE/TIME); without it they are listed as not measured.
FILE defaults to conf/claims/papers.yaml. OVERRIDEs apply to every run."""

DEFAULT_FILE = Path("conf/claims/papers.yaml")
OWN_KEYS = ("claims", "out", "from", "repeats", "search")


@dataclass(frozen=True)
class ClaimsArgs:
    path: Path  # the claims file
    gate: GateArgs  # how its measurements (a gate file) run
    search_dir: Path | None  # a knee search to read the sustained-rate measurements from


def parse_args(args: list[str]) -> ClaimsArgs:
    """The claims file, the gate arguments its measurements run with, and the search."""
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
    search_dir = Path(own["search"]) if "search" in own else None
    if search_dir is not None and not (search_dir / "search.json").is_file():
        raise ConfigError("search", f"{search_dir} holds no search.json of a knee search")
    return ClaimsArgs(path, gate, search_dir)


def run_claims(args: ClaimsArgs) -> dict:
    """Check the claims file (its measurements, the search) before any work, measure or
    read, and write the record and its pages into the gate's directory; returns the record."""
    start = time.perf_counter()
    measurements = load_gate(args.gate.path, machine_fingerprint())
    path = args.path
    claims = parse_claims_file(path.read_text(), path, {c.name for c in measurements.claims})
    knees: list[dict] = []
    if args.search_dir is not None:
        found = read_knees(args.search_dir)
        knees = [knee_measurement(k, found, args.search_dir) for k in claims.knees]
    from servelab.harness.run.run import run

    gate = run_gate(args.gate, reported(partial(run, progress=False)), build_gate_report)
    search = None if args.search_dir is None else str(args.search_dir)
    record = claims_record(claims, gate, knees, search, time.perf_counter() - start)
    out = Path(gate["dir"])
    write_json_atomic(out / "claims.json", record)
    (out / "claims.md").write_text(claims_markdown(record), encoding="utf-8")
    build_claims_report(out)
    return record


def main(args: list[str]) -> None:
    record = run_claims(parse_args(args))
    print(render_claims(record))
    print(f"claims.json, claims.md and claims.html in {record['gate_dir']}")
