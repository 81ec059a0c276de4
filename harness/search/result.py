"""One strategy's outcome of a search: its fitted knee, its ceiling and prediction, every probe
it ran, and whether it resolved; as `search.json` records it and reads it back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servelab.harness.search.estimator import Knee
from servelab.harness.search.probes import Probe


@dataclass
class StrategyResult:
    """One strategy's sustained rate: the knee fitted on its rate probes (`fit`), or bounded by
    its ceiling alone where none ran (`knee`)."""

    strategy: str
    ceiling: float | None = None  # request throughput with every request at once
    predicted: float | None = None  # the simulator's knee, where the search had one
    fit: Knee | None = None  # fitted on every rate probe
    resolved: bool = False  # the interval came within the resolution
    gone: bool = False  # what served it exited or never answered: its search ended there
    budget_spent: bool = False  # the budget ran out before its search ended (raise budget_s)
    note: str = ""
    probes: list[Probe] = field(default_factory=list)

    @property
    def knee(self) -> Knee:
        """The knee: the fit, else the ceiling's bound alone."""
        return self.fit if self.fit is not None else Knee.unprobed(self.ceiling)

    @property
    def estimate(self) -> float | None:
        return self.knee.estimate

    @property
    def low(self) -> float | None:
        """The interval's low end: None where no probe bounds it (or none is sustained)."""
        return self.knee.low

    @property
    def high(self) -> float | None:
        """The interval's high end: the ceiling where no rate probe bounds it."""
        return self.knee.high

    @property
    def width(self) -> float:
        return self.knee.width

    @property
    def widened_by(self) -> float:
        """The speed drift's factor the interval was widened by (1 where none was fitted)."""
        return self.knee.widened_by

    @property
    def rate_probes(self) -> list[Probe]:
        return [p for p in self.probes if p.spec.kind == "rate"]

    def to_json(self) -> dict:
        """The result as `search.json` records it (`result_of_record` reads it back)."""
        fit = self.fit
        return {
            "strategy": self.strategy,
            "ceiling": self.ceiling,
            "predicted": self.predicted,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "cliff": bool(fit and fit.cliff),
            "below": None if fit is None else fit.below,
            "above": None if fit is None else fit.above,
            "widened_by": self.widened_by,
            "resolved": self.resolved,
            "gone": self.gone,
            "budget_spent": self.budget_spent,
            "note": self.note,
            "probes": [
                {
                    "kind": p.spec.kind,
                    "rate": p.spec.rate,
                    "requests": p.spec.requests,
                    "draw": p.spec.draw,
                    "warmup": p.spec.warmup,
                    "sized_by": p.spec.sized_by,
                    "run_dir": p.outcome.run_dir,
                    "quantile": _finite(p.quantile.quantile),
                    "quantile_low": p.quantile.low,
                    "quantile_high": _finite(p.quantile.high),
                    "over_capacity": p.quantile.over_capacity,
                    "met": p.outcome.ratios.met,
                    "counted": len(p.outcome.ratios.ratios),
                    "draws": p.quantile.effective,  # the independent draws they stand for
                    "stopped": p.outcome.stopped,
                    "seconds": p.outcome.seconds,
                    "cache_nonce": p.outcome.cache_nonce,  # its prompts new to a server's cache
                    "warm_cache_share": p.outcome.warm_cache_share,
                }
                for p in self.probes
            ],
        }


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def result_of_record(record: dict) -> StrategyResult:
    """A strategy's result as `search.json` records it, without its probes: to read a search
    again."""
    fields = ("estimate", "low", "high", "cliff", "below", "above")
    return StrategyResult(
        strategy=record["strategy"],
        ceiling=record.get("ceiling"),
        predicted=record.get("predicted"),
        fit=Knee(
            **{key: record.get(key) for key in fields},
            probes=(),
            widened_by=record.get("widened_by") or 1.0,
        ),
        resolved=bool(record.get("resolved")),
        gone=bool(record.get("gone")),
        budget_spent=bool(record.get("budget_spent")),
        note=record.get("note", ""),
    )
