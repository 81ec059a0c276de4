"""Claims on sustained rates: the ratio of two strategies' knees, read from a knee search's
`search.json` (`servelab search`, `make run`), as measurements shaped like a gate's.

A paper's "N times the throughput at the same latency" is a ratio of sustained rates under one
SLO, which only a knee search measures; it is too long to run inside `servelab claims`, so a
claims file names such measurements (`knees:`) and `servelab claims search=DIR` reads them
from a search already run. The interval joins the two knees' intervals' far ends
(`harness.search.estimator.knee_ratio`); an interval open on one side cannot pass or fail
on that side, so it is inconclusive.
Without `search=DIR` these measurements are listed as not measured and left out of verdicts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.base.errors import ConfigError
from servelab.harness.gate.spec import entry_name
from servelab.harness.measure.bootstrap import DIRECTIONS, Outcome, verdict
from servelab.harness.search.estimator import knee_ratio
from servelab.harness.search.result import StrategyResult, result_of_record

KNEE_KEYS = {"name", "of", "over", *DIRECTIONS}


@dataclass(frozen=True)
class KneeClaim:
    name: str
    of: str  # strategy names as the search ran them
    over: str
    direction: str
    bound: float

    @property
    def statement(self) -> str:
        sign = ">=" if self.direction == "at_least" else "<="
        return f"sustained rate {self.of} / {self.over} {sign} {self.bound:g}"


def parse_knee_claims(raw: Any, field: str) -> tuple[KneeClaim, ...]:
    """The `knees:` entries of a claims file."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(field, "a list of {name, of, over, at_least or at_most}")
    claims = []
    for index, node in enumerate(raw):
        where = f"{field}[{index}]"
        if not isinstance(node, dict):
            raise ConfigError(where, "each is a mapping: {name, of, over, at_least or at_most}")
        name = entry_name(node, KNEE_KEYS, where)
        given = [d for d in DIRECTIONS if d in node]
        sides = [node.get("of"), node.get("over")]
        if len(given) != 1 or not all(isinstance(s, str) and s for s in sides):
            raise ConfigError(f"{where} ({name})", "give of, over and one bound")
        claims.append(KneeClaim(name, *sides, given[0], float(node[given[0]])))
    return tuple(claims)


def read_knees(search_dir: Path) -> dict[str, StrategyResult]:
    """The knees of a search directory, by strategy."""
    path = search_dir / "search.json"
    if not path.is_file():
        raise ConfigError("search", f"{path} does not exist; give a `servelab search` out_dir")
    record = json.loads(path.read_text())
    return {k["strategy"]: result_of_record(k) for k in record["knees"]}


def knee_measurement(claim: KneeClaim, knees: dict[str, StrategyResult], search_dir: Path) -> dict:
    """One knee claim as a measurement record of the gate's form (`harness.gate.record`)."""
    missing = [s for s in (claim.of, claim.over) if s not in knees]
    if missing:
        raise ConfigError(f"knees ({claim.name})", f"{search_dir} has no knee of {missing[0]}")
    ratio = knee_ratio(knees[claim.of].knee, knees[claim.over].knee)
    estimate, low, high = ratio.estimate, ratio.low, ratio.high
    outcome = verdict(
        low if low is not None else 0.0,
        high if high is not None else math.inf,
        claim.bound,
        claim.direction,
    )
    return {
        "name": claim.name,
        "kind": "knee",
        "statement": claim.statement,
        "of": claim.of,
        "over": claim.over,
        "direction": claim.direction,
        "bound": claim.bound,
        "estimate": estimate,
        "low": low,
        "high": high,
        "samples": None,
        "outcome": outcome.value,
        "inconclusive_counts_as": "fail",
        "counted": Outcome.PASS.value if outcome is Outcome.PASS else Outcome.FAIL.value,
        "sources": [str(search_dir / "search.json")],
        "notes": ["interval from the two knees' intervals"],
    }
