"""A gate checked: its file read with the command line's settings, its runs planned and
measured (or an earlier gate's read), its claims evaluated and recorded. The run function and
the page's drawing come from the command that asked (`servelab gate`, `servelab claims`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from servelab.harness.gate.collect import composed, measure, read_earlier
from servelab.harness.gate.evaluate import evaluate
from servelab.harness.gate.fingerprint import machine_fingerprint
from servelab.harness.gate.plan import plan_gate
from servelab.harness.gate.record import gate_record
from servelab.harness.gate.spec import GateSpec, load_gate
from servelab.harness.measure.rundir import write_json_atomic
from servelab.harness.run.compose import compose
from servelab.harness.search.probes import RunFn


@dataclasses.dataclass(frozen=True)
class GateArgs:
    path: Path
    out: Path | None
    read_from: Path | None
    repeats: int | None
    inconclusive: str | None
    overrides: list[str]


def with_arguments(spec: GateSpec, args: GateArgs) -> GateSpec:
    """The gate file's settings with the command line's `repeats=` and `inconclusive=`."""
    claims = spec.claims
    if args.inconclusive is not None:
        claims = tuple(dataclasses.replace(c, inconclusive=args.inconclusive) for c in claims)
    repeats = spec.repeats if args.repeats is None else args.repeats
    return dataclasses.replace(spec, claims=claims, repeats=repeats)


def run_gate(args: GateArgs, run: RunFn, draw: Callable[[Path], None]) -> dict:
    """Plan, measure with `run` (or read), evaluate and record, the page drawn by `draw`;
    returns the gate record."""
    start = time.perf_counter()
    machine = machine_fingerprint()
    spec = with_arguments(load_gate(args.path, machine), args)
    stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    root = args.read_from or args.out or Path("runs/gates") / spec.name / stamp
    out = args.out or root
    plan = plan_gate(spec, root, args.overrides)
    configs = composed(plan, compose)
    data = read_earlier(plan, configs) if args.read_from else measure(plan, configs, run)
    results = evaluate(spec, plan, data)
    elapsed = time.perf_counter() - start
    source = None if args.read_from is None else str(args.read_from)
    record = gate_record(spec, results, data, machine, elapsed, out, source)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "gate.json", record)
    draw(out)
    return record
