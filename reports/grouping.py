"""Sort a sweep's runs into comparable groups and give each strategy a distinct label.

Runs belong to one group when their workload config, model and SLO agree on everything
except the load: the arrival rate for open-loop runs (constant, poisson, gamma), the
concurrency for closed-loop runs (or offline runs that set one). Within a group that load
is the x axis of every curve; offline and trace runs without either get bars. Strategy
labels are preset names, extended with the axes that differ when one name was run with
several axis overrides (`vllm (heads=mha)`), so each curve and colour stands for exactly
one configuration.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from servelab.reports.derive import request_metrics
from servelab.reports.load import RunData

NON_RATE_PROCESSES = ("offline", "closed_loop", "trace")
X_TITLES = {
    "rate": "request rate (req/s)",
    "concurrency": "concurrency (requests in flight)",
    "none": "strategy",
}


@dataclass
class SweepRun:
    """One run of a sweep with its label, its load (x) and per-request metrics."""

    run: RunData
    label: str
    x: float | None
    metrics: pd.DataFrame | None


@dataclass
class Group:
    """Runs that differ only in strategy and load; `x_kind` is rate, concurrency or none."""

    key: str
    title: str
    x_kind: str
    slo: dict[str, Any]
    runs: list[SweepRun] = field(default_factory=list)

    @property
    def x_title(self) -> str:
        """The x axis title (with unit) for this group's curves."""
        return X_TITLES[self.x_kind]

    @property
    def labels(self) -> list[str]:
        """The strategy labels in this group, sorted."""
        return sorted({r.label for r in self.runs})


def flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level with dotted keys (`arrival.rate`)."""
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        name = f"{prefix}{key}"
        if isinstance(inner, dict):
            flat.update(flatten(inner, f"{name}."))
        else:
            flat[name] = inner
    return flat


def differing(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each flat dict, only the entries whose value is not the same in all of them."""
    keys = sorted({k for item in items for k in item})
    varying = [k for k in keys if len({json.dumps(i.get(k), default=str) for i in items}) > 1]
    return [{k: item.get(k) for k in varying} for item in items]


def _finite_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def load_kind(run: RunData) -> str:
    """`rate` for open-loop runs with a finite rate; `concurrency` for runs with a fixed number
    in flight (closed loop, or offline with a concurrency); `none` otherwise (offline, trace)."""
    process = str(run.arrival.get("process", "")).lower()
    if process not in NON_RATE_PROCESSES and _finite_number(run.arrival.get("rate")) is not None:
        return "rate"
    return "concurrency" if _finite_number(run.arrival.get("concurrency")) is not None else "none"


def _mode(run: RunData, kind: str) -> str:
    if kind == "rate":
        return "online"
    return str(run.arrival.get("process") or "offline").replace("_", " ")


def strategy_labels(runs: list[RunData]) -> list[str]:
    """A label per run: the strategy name, plus the axes that differ among runs of that name."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for index, run in enumerate(runs):
        by_name[run.strategy_name].append(index)
    labels = [run.strategy_name for run in runs]
    for name, indices in by_name.items():
        axes = [
            flatten({k: v for k, v in runs[i].strategy.items() if k != "name"}) for i in indices
        ]
        for index, diff in zip(indices, differing(axes), strict=True):
            if diff:
                labels[index] = f"{name} ({', '.join(f'{k}={v}' for k, v in diff.items())})"
    return labels


def _key(run: RunData) -> dict[str, Any]:
    kind = load_kind(run)
    workload = dict(run.workload)
    load = ("rate",) if kind == "rate" else ("rate", "concurrency")
    workload["arrival"] = {k: v for k, v in run.arrival.items() if k not in load}
    return {"load": kind, "workload": workload, "model": run.model_name, "slo": run.slo}


def group_runs(runs: list[RunData]) -> list[Group]:
    """Groups of comparable runs, in order of first appearance, each with its x axis kind."""
    labels = strategy_labels(runs)
    groups: dict[str, Group] = {}
    keys: list[dict[str, Any]] = []
    for run, label in zip(runs, labels, strict=True):
        key_dict = _key(run)
        key = json.dumps(key_dict, sort_keys=True, default=str)
        kind = key_dict["load"]
        if key not in groups:
            groups[key] = Group(key, "", kind, run.slo)
            keys.append(key_dict)
        x = _finite_number(run.arrival.get(kind)) if kind != "none" else None
        metrics = request_metrics(run.request_records) if run.request_records else None
        groups[key].runs.append(SweepRun(run, label, x, metrics))
    _title_groups(list(groups.values()), keys)
    return list(groups.values())


def _title_groups(groups: list[Group], keys: list[dict[str, Any]]) -> None:
    bases = []
    for group in groups:
        run = group.runs[0].run
        bases.append(f"{run.workload_name} · {run.model_name} · {_mode(run, group.x_kind)}")
    for base in set(bases):
        same = [i for i, b in enumerate(bases) if b == base]
        diffs = differing([flatten(keys[i]) for i in same]) if len(same) > 1 else [{}] * len(same)
        for index, diff in zip(same, diffs, strict=True):
            extra = ", ".join(f"{k}={v}" for k, v in diff.items())
            groups[index].title = f"{base} ({extra})" if extra else base
