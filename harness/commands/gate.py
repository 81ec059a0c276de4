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

import dataclasses
import json
import time
from datetime import datetime
from functools import partial
from pathlib import Path

from servelab.base.errors import ConfigError
from servelab.harness.commands.config import compose
from servelab.harness.gate.collect import composed, measure, read_earlier
from servelab.harness.gate.evaluate import evaluate
from servelab.harness.gate.fingerprint import machine_fingerprint
from servelab.harness.gate.plan import plan_gate
from servelab.harness.gate.record import gate_record, render_gate
from servelab.harness.gate.spec import POLICIES, GateSpec, load_gate
from servelab.harness.measure.rundir import write_json_atomic
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


@dataclasses.dataclass(frozen=True)
class GateArgs:
    path: Path
    out: Path | None
    read_from: Path | None
    repeats: int | None
    inconclusive: str | None
    overrides: list[str]


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


def with_arguments(spec: GateSpec, args: GateArgs) -> GateSpec:
    """The gate file's settings with the command line's `repeats=` and `inconclusive=`."""
    claims = spec.claims
    if args.inconclusive is not None:
        claims = tuple(dataclasses.replace(c, inconclusive=args.inconclusive) for c in claims)
    repeats = spec.repeats if args.repeats is None else args.repeats
    return dataclasses.replace(spec, claims=claims, repeats=repeats)


def run_gate(args: GateArgs) -> dict:
    """Plan, measure (or read), evaluate and record; returns the gate record."""
    start = time.perf_counter()
    machine = machine_fingerprint()
    spec = with_arguments(load_gate(args.path, machine), args)
    stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    root = args.read_from or args.out or Path("runs/gates") / spec.name / stamp
    out = args.out or root
    plan = plan_gate(spec, root, args.overrides)
    configs = composed(plan, compose)
    if args.read_from:
        data = read_earlier(plan, configs)
    else:
        from servelab.harness.runner.run import run

        data = measure(plan, configs, reported(partial(run, progress=False)))
    results = evaluate(spec, plan, data)
    elapsed = time.perf_counter() - start
    source = None if args.read_from is None else str(args.read_from)
    record = gate_record(spec, results, data, machine, elapsed, out, source)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "gate.json", record)
    build_gate_report(out)
    return record


def main(args: list[str]) -> None:
    if args and args[0] == "fingerprint":
        machine = machine_fingerprint()
        print(f"fingerprint: {machine.id}")
        print(json.dumps(machine.parts, indent=2))
        return
    gate_args = parse_args(args)
    record = run_gate(gate_args)
    print(render_gate(record))
    print(f"gate.json and gate.html in {record['dir']}")
    if not record["passed"]:
        raise SystemExit(1)
