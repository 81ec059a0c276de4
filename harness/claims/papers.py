"""Claims files (`conf/claims/*.yaml`): the papers' claims, each tied to the measurements that
stand for it, and the rule that turns those measurements into a verdict.

A claims file names a measurements file (a gate file, `harness.gate.spec`, read relative to
the claims file), may name measurements of sustained rates read from a knee search
(`knees:`, `harness.claims.knees`), and lists claims: the paper, its words, its figure, its
conditions, the measurements (`measured`) that test it on this machine, and one sentence on
what differs from the paper's setup. A claim the machine cannot test (`not_testable`, with
the reason) keeps that verdict whatever its measurements show; they are reported beside it.
Every mistake is one `ConfigError` naming the file, the claim and the key, before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from servelab.base.errors import ConfigError
from servelab.harness.claims.knees import KneeClaim, parse_knee_claims
from servelab.harness.gate.spec import entry_name
from servelab.harness.measure.bootstrap import Outcome

FILE_KEYS = {"name", "measurements", "knees", "claims"}
CLAIM_KEYS = {
    "name",
    "paper",
    "says",
    "figure",
    "conditions",
    "measured",
    "not_testable",
    "differs",
}
TEXT_KEYS = ("paper", "says", "figure", "conditions", "differs")


class Verdict(str, Enum):
    HOLDS = "holds"
    IN_PART = "holds in part"
    DOES_NOT_HOLD = "does not hold here"
    NOT_TESTABLE = "not testable here"
    UNDECIDED = "undecided here"  # every measurement inconclusive: no side is supported


@dataclass(frozen=True)
class PaperClaim:
    name: str
    paper: str
    says: str
    figure: str
    conditions: str
    measured: tuple[str, ...]  # names of claims in the measurements file
    differs: str
    not_testable: str | None = None


@dataclass(frozen=True)
class ClaimsFile:
    name: str
    path: Path
    measurements: Path
    knees: tuple[KneeClaim, ...]  # read from a knee search (`servelab claims search=DIR`)
    claims: tuple[PaperClaim, ...]


def verdict_of(claim: PaperClaim, outcomes: list[Outcome]) -> Verdict:
    """All measurements pass: holds; some: holds in part; none but some decided: does not
    hold; all inconclusive: undecided. A claim marked `not_testable` keeps that verdict."""
    if claim.not_testable is not None:
        return Verdict.NOT_TESTABLE
    passed = sum(o is Outcome.PASS for o in outcomes)
    if outcomes and passed == len(outcomes):
        return Verdict.HOLDS
    if passed:
        return Verdict.IN_PART
    if all(o is Outcome.INCONCLUSIVE for o in outcomes):
        return Verdict.UNDECIDED
    return Verdict.DOES_NOT_HOLD


def _text(node: dict, key: str, field: str) -> str:
    value = node.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field}.{key}", "give it as text")
    return " ".join(value.split())


def parse_claim(node: Any, field: str, known: set[str]) -> PaperClaim:
    """One claim entry; `known` holds the measurements file's claim names."""
    if not isinstance(node, dict):
        raise ConfigError(field, "each claim is a mapping (name, paper, says, measured, ...)")
    name = entry_name(node, CLAIM_KEYS, field)
    field = f"{field} ({name})"
    measured = node.get("measured")
    if not isinstance(measured, list) or not measured:
        raise ConfigError(f"{field}.measured", "list the measurements that test it")
    missing = [m for m in measured if m not in known]
    if missing:
        raise ConfigError(
            f"{field}.measured", f"{missing[0]!r} is not a claim of the measurements file"
        )
    texts = {key: _text(node, key, field) for key in TEXT_KEYS}
    not_testable = node.get("not_testable")
    if not_testable is not None:
        not_testable = _text(node, "not_testable", field)
    return PaperClaim(name=name, measured=tuple(measured), not_testable=not_testable, **texts)


def parse_claims_file(text: str, path: Path, known: set[str]) -> ClaimsFile:
    """A claims file whose measurements file has the claim names `known` (its `knees:`
    entries name measurements too)."""
    field = path.name
    node = yaml.safe_load(text)
    if not isinstance(node, dict):
        raise ConfigError(field, "a claims file is a mapping with measurements and claims")
    unknown = set(node) - FILE_KEYS
    if unknown:
        raise ConfigError(f"{field}.{sorted(unknown)[0]}", f"unknown key; use: {sorted(FILE_KEYS)}")
    knees = parse_knee_claims(node.get("knees"), f"{field}: knees")
    overlap = sorted(known & {k.name for k in knees})
    if overlap:
        raise ConfigError(f"{field}: knees", f"{overlap[0]!r} is a measurement's name already")
    known = known | {k.name for k in knees}
    raw = node.get("claims")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{field}.claims", "list at least one claim")
    claims = tuple(parse_claim(c, f"{field}: claims[{i}]", known) for i, c in enumerate(raw))
    names = [c.name for c in claims]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{field}.claims", f"claim names must differ; {repeated[0]!r} repeats")
    name = str(node.get("name", path.stem))
    return ClaimsFile(name, path, measurements_path(node, path), knees, claims)


def measurements_path(node: dict, path: Path) -> Path:
    """The measurements file a claims file names, relative to the claims file."""
    value = node.get("measurements")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path.name}.measurements", "name the measurements (gate) file")
    found = path.parent / value
    if not found.is_file():
        raise ConfigError(f"{path.name}.measurements", f"{found} is not a file")
    return found


def read_measurements_path(path: Path) -> Path:
    """The measurements file of the claims file at `path` (read before its claim names are)."""
    if not path.is_file():
        raise ConfigError("claims", f"{path} is not a file; e.g. conf/claims/papers.yaml")
    node = yaml.safe_load(path.read_text())
    if not isinstance(node, dict):
        raise ConfigError(path.name, "a claims file is a mapping with measurements and claims")
    return measurements_path(node, path)
