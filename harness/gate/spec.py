"""Gate files (`conf/gates/*.yaml`): claims about strategies, read and checked before any work.

A gate file names workloads (lists of config overrides) and claims. Each claim has a kind:

- `metric`: a summary metric (`output_throughput`, `ttft.p99`, `kv_waste_mean`, ...) of one
  strategy on a workload, over the same metric of another (`of` / `over`: a ratio) or alone
  against a constant; measured in repeated, interleaved runs.
- `identical`: the greedy outputs of each strategy in `of` against those of `over` (the
  reference) on a workload; the share of identical requests, 1.0 unless a bound says less.
- `perplexity`: perplexity on held-out text of the model as `of` serves it (head layout,
  weights), over that of `over`, or alone.

A side (`of`, `over`) is a strategy preset name, optionally followed by overrides:
`vllm`, `"vllm strategy.heads=mqa"`. The bound is `at_least: X` or `at_most: X`. An absolute
bound on a timing metric must carry the `fingerprint` of the machine it was measured on
(`servelab gate fingerprint`) and is refused on any other machine. Every mistake is one
`ConfigError` line naming the file, the claim and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servelab.base.errors import ConfigError
from servelab.harness.gate.fingerprint import Fingerprint
from servelab.harness.measure.bootstrap import DIRECTIONS
from servelab.harness.measure.summary_schema import metric_names
from servelab.harness.run.compose import check_group_choices

KINDS = ("metric", "identical", "perplexity")
POLICIES = ("pass", "fail")
# Counts and shares the schedule decides: comparable across machines as they are.
SCHEDULE_METRICS = metric_names("schedule")
# Times and rates: absolute values hold only on the machine that measured them.
TIMING_METRICS = metric_names("timing")
GATE_KEYS = {
    "name",
    "repeats",
    "confidence",
    "resamples",
    "seed",
    "inconclusive",
    "overrides",
    "workloads",
    "claims",
}
CLAIM_KEYS = {
    "name",
    "kind",
    "workload",
    "metric",
    "of",
    "over",
    "at_least",
    "at_most",
    "inconclusive",
    "fingerprint",
    "windows",
}
DEFAULT_REFERENCE = "fastertransformer"


@dataclass(frozen=True)
class Side:
    """One side of a claim: a strategy preset and overrides, as written (`label`)."""

    label: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class Claim:
    name: str
    kind: str  # metric | identical | perplexity
    of: Side
    over: Side | None  # None: `of` alone against the bound
    direction: str  # at_least | at_most
    bound: float
    inconclusive: str  # how an inconclusive outcome counts: pass | fail
    workload: str | None = None  # metric, identical
    metric: str | None = None  # metric: a summary key, dotted for distributions
    windows: int = 4  # perplexity: windows of held-out text

    @property
    def statement(self) -> str:
        """The claim in one line, e.g. `output_throughput vllm / fastertransformer >= 1.5`."""
        quantity = {"metric": self.metric, "identical": "identical share"}.get(
            self.kind, "perplexity"
        )
        if self.over is None:
            sides = self.of.label
        else:
            between = " vs " if self.kind == "identical" else " / "
            sides = f"{self.of.label}{between}{self.over.label}"
        sign = ">=" if self.direction == "at_least" else "<="
        where = f" on {self.workload}" if self.workload else ""
        return f"{quantity} {sides}{where} {sign} {self.bound:g}"


@dataclass(frozen=True)
class GateSpec:
    name: str
    path: Path
    repeats: int
    confidence: float
    resamples: int
    seed: int
    inconclusive: str
    overrides: tuple[str, ...]
    workloads: dict[str, tuple[str, ...]]
    claims: tuple[Claim, ...]


def parse_side(text: Any, field: str) -> Side:
    """`"vllm strategy.heads=mqa"` -> Side(label, ("strategy=vllm", "strategy.heads=mqa"))."""
    if not isinstance(text, str) or not text.split():
        raise ConfigError(field, f"{text!r}: name a strategy preset, e.g. vllm")
    words = text.split()
    presets = [w for w in words if "=" not in w]
    if len(presets) != 1 or words[0] != presets[0]:
        raise ConfigError(
            field, f"{text!r}: start with one strategy preset, then KEY=VALUE overrides"
        )
    overrides = (f"strategy={presets[0]}", *words[1:])
    check_group_choices(list(overrides))
    return Side(" ".join(words), overrides)


def _overrides(value: Any, field: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) and "=" in i for i in items):
        raise ConfigError(field, f"{value!r}: give a list of KEY=VALUE overrides")
    check_group_choices(items)
    return tuple(items)


def _number(node: dict, key: str, default: float, field: str, low: float, high: float) -> float:
    value = node.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ConfigError(f"{field}.{key}", f"{value!r} must be a number in [{low:g}, {high:g}]")
    return float(value)


def _choice(node: dict, key: str, default: str, allowed: tuple[str, ...], field: str) -> str:
    value = node.get(key, default)
    if value not in allowed:
        raise ConfigError(f"{field}.{key}", f"{value!r} is not one of: {', '.join(allowed)}")
    return str(value)


def _bound(node: dict, field: str, kind: str) -> tuple[str, float]:
    given = [d for d in DIRECTIONS if d in node]
    if kind == "identical" and not given:
        return "at_least", 1.0
    if len(given) != 1:
        raise ConfigError(field, "give exactly one bound: at_least: X or at_most: X")
    value = node[given[0]]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{field}.{given[0]}", f"{value!r} must be a number")
    if kind == "identical" and given[0] != "at_least":
        raise ConfigError(field, "an identical claim bounds the share from below: at_least")
    return given[0], float(value)


def _check_fingerprint(node: dict, claim: Claim, field: str, machine: Fingerprint) -> None:
    """An absolute bound on a timing metric needs this machine's fingerprint; nothing else
    takes one."""
    recorded = node.get("fingerprint")
    if claim.over is not None or claim.kind != "metric" or claim.metric not in TIMING_METRICS:
        if recorded is not None:
            raise ConfigError(
                f"{field}.fingerprint", "only an absolute bound on a timing metric takes one"
            )
        return
    if recorded is None:
        raise ConfigError(
            f"{field}.fingerprint",
            f"an absolute bound on {claim.metric} holds only on the machine that measured "
            f"it; add this machine's (fingerprint: {machine.id}, from `servelab gate "
            "fingerprint`) or claim a ratio over another strategy",
        )
    if str(recorded) != machine.id:
        raise ConfigError(
            f"{field}.fingerprint",
            f"bound recorded on machine {recorded}, this is {machine.id}; re-measure the "
            "bound here and record this fingerprint, or claim a ratio over another strategy",
        )


def entry_name(node: dict, keys: set[str], field: str) -> str:
    """The name of a claim entry whose keys are all among `keys`."""
    unknown = set(node) - keys
    if unknown:
        raise ConfigError(f"{field}.{sorted(unknown)[0]}", f"unknown key; use: {sorted(keys)}")
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{field}.name", "give every claim a name")
    return name


def parse_claims(
    node: dict, index: int, field: str, workloads: dict, policy: str, machine: Fingerprint
) -> list[Claim]:
    """One claim entry; an `identical` entry with several strategies gives one claim each."""
    name = entry_name(node, CLAIM_KEYS, field)
    field = f"{field} ({name})"
    kind = _choice(node, "kind", "metric", KINDS, field)
    direction, bound = _bound(node, field, kind)
    inconclusive = _choice(node, "inconclusive", policy, POLICIES, field)
    workload = node.get("workload")
    if kind != "perplexity" and workload not in workloads:
        raise ConfigError(
            f"{field}.workload",
            f"{workload!r} is not one of the gate's workloads {sorted(workloads)}",
        )
    if kind == "perplexity" and workload is not None:
        raise ConfigError(f"{field}.workload", "perplexity is measured on held-out text")
    metric = node.get("metric")
    if kind == "metric" and metric not in (*SCHEDULE_METRICS, *TIMING_METRICS):
        raise ConfigError(
            f"{field}.metric",
            f"{metric!r} is not a summary metric; e.g. output_throughput, ttft.p99, kv_waste_mean",
        )
    if kind != "metric" and metric is not None:
        raise ConfigError(f"{field}.metric", f"a {kind} claim has its own metric")
    if kind != "perplexity" and "windows" in node:
        raise ConfigError(f"{field}.windows", "only a perplexity claim scores windows of text")
    windows = int(_number(node, "windows", 4, field, 1, 10_000))
    over_text = node.get("over", DEFAULT_REFERENCE if kind == "identical" else None)
    over = None if over_text is None else parse_side(over_text, f"{field}.over")
    of_texts = node.get("of")
    if kind == "identical" and isinstance(of_texts, list):
        sides = [parse_side(t, f"{field}.of") for t in of_texts]
    else:
        sides = [parse_side(of_texts, f"{field}.of")]
    claims = []
    for side in sides:
        label = f"{name}[{side.label}]" if len(sides) > 1 else name
        claim = Claim(
            label, kind, side, over, direction, bound, inconclusive, workload, metric, windows
        )
        _check_fingerprint(node, claim, field, machine)
        claims.append(claim)
    return claims


def parse_gate(text: str, path: Path, machine: Fingerprint) -> GateSpec:
    field = path.name
    gate = f"{field}: gate"
    try:
        node = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(field, f"not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(node, dict):
        raise ConfigError(field, "a gate file is a mapping with workloads and claims")
    unknown = set(node) - GATE_KEYS
    if unknown:
        raise ConfigError(f"{gate}.{sorted(unknown)[0]}", f"unknown key; use: {sorted(GATE_KEYS)}")
    policy = _choice(node, "inconclusive", "fail", POLICIES, gate)
    raw_workloads = node.get("workloads") or {}
    if not isinstance(raw_workloads, dict):
        raise ConfigError(f"{gate}.workloads", "a mapping of names to lists of overrides")
    workloads = {str(k): _overrides(v, f"{gate}.workloads.{k}") for k, v in raw_workloads.items()}
    raw_claims = node.get("claims")
    if not isinstance(raw_claims, list) or not raw_claims:
        raise ConfigError(f"{gate}.claims", "list at least one claim")
    claims: list[Claim] = []
    for index, claim in enumerate(raw_claims):
        where = f"{field}: claims[{index}]"
        if not isinstance(claim, dict):
            raise ConfigError(where, "each claim is a mapping (name, of, at_least, ...)")
        claims += parse_claims(claim, index, where, workloads, policy, machine)
    names = [c.name for c in claims]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{gate}.claims", f"claim names must differ; {repeated[0]!r} repeats")
    return GateSpec(
        name=str(node.get("name", path.stem)),
        path=path,
        repeats=int(_number(node, "repeats", 5, gate, 2, 1000)),
        confidence=_number(node, "confidence", 0.95, gate, 0.5, 0.999),
        resamples=int(_number(node, "resamples", 2000, gate, 100, 1_000_000)),
        seed=int(_number(node, "seed", 0, gate, 0, 2**31)),
        inconclusive=policy,
        overrides=_overrides(node.get("overrides") or [], f"{gate}.overrides"),
        workloads=workloads,
        claims=tuple(claims),
    )


def load_gate(path: Path, machine: Fingerprint) -> GateSpec:
    if not path.is_file():
        raise ConfigError(
            "gate", f"{path} is not a file; give a gate file, e.g. conf/gates/headline.yaml"
        )
    return parse_gate(path.read_text(), path, machine)
