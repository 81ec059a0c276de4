"""`servelab gate FILE`: check a gate file's claims with runs measured side by side, here and now.

Shared CI machines are noisy, so a claim compares strategies measured in the same job, each
run repeated and the strategies interleaved, rather than against absolute times from another
day or machine. For every claim the verb computes the estimate and its bootstrap interval and
decides pass, fail (the whole interval on the wrong side of the bound) or inconclusive (the
interval across the bound; counted as the gate file says, fail by default). It prints a
table, writes `gate.json` and `gate.html` beside the runs, and exits 0 when every claim
counts as passed, 1 otherwise (2 for bad input, before any work).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.gate.fingerprint import machine_fingerprint
from servelab.harness.gate.record import render_gate
from servelab.harness.gate.run import GateArgs, run_gate
from servelab.harness.gate.spec import POLICIES
from servelab.reports.gate_report import build_gate_report
from servelab.reports.run_report import reported

SUMMARY = "check a gate file's claims on runs measured side by side (exit 1 if one fails)"
USAGE = """usage: servelab gate FILE [repeats=N] [inconclusive=pass|fail] [out=DIR] [from=DIR]
                     [OVERRIDE ...]
       servelab gate fingerprint        this machine's fingerprint, for absolute bounds

Runs what the claims need, each repeated N times with the strategies interleaved, into
out=DIR (default runs/gates/NAME/DATE-TIME), or reads an earlier gate's runs from=DIR; then
prints every claim's estimate, bootstrap interval and outcome and writes gate.json and
gate.html (into out=DIR, else beside the runs). OVERRIDEs apply to every run (e.g.
model=dummy-tiny). Exit status 0 when every claim passes (inconclusive ones count as the
gate file says), 1 otherwise."""


def parse_args(args: list[str]) -> GateArgs:
    if not args or "=" in args[0]:
        raise ConfigError(
            "gate", "name a gate file first, e.g. servelab gate conf/gates/headline.yaml"
        )
    own: dict[str, str] = {}
    overrides = []
    for arg in args[1:]:
        key, _, value = arg.partition("=")
        if key in ("out", "from", "repeats", "inconclusive"):
            own[key] = value
        else:
            overrides.append(arg)
    repeats = own.get("repeats")
    if repeats is not None and not (repeats.isdigit() and int(repeats) >= 2):
        raise ConfigError("repeats", f"{repeats!r} must be a whole number, at least 2")
    if own.get("inconclusive", "fail") not in POLICIES:
        raise ConfigError("inconclusive", f"{own['inconclusive']!r} is not one of pass, fail")
    read_from = Path(own["from"]) if "from" in own else None
    if read_from is not None and not read_from.is_dir():
        raise ConfigError("from", f"{read_from} is not a directory of an earlier gate")
    return GateArgs(
        path=Path(args[0]),
        out=Path(own["out"]) if "out" in own else None,
        read_from=read_from,
        repeats=None if repeats is None else int(repeats),
        inconclusive=own.get("inconclusive"),
        overrides=overrides,
    )


def main(args: list[str]) -> None:
    if args and args[0] == "fingerprint":
        machine = machine_fingerprint()
        print(f"fingerprint: {machine.id}")
        print(json.dumps(machine.parts, indent=2))
        return
    from servelab.harness.run.run import run

    record = run_gate(parse_args(args), reported(partial(run, progress=False)), build_gate_report)
    print(render_gate(record))
    print(f"gate.json and gate.html in {record['dir']}")
    if not record["passed"]:
        raise SystemExit(1)
