"""The SLO of an earlier search (`search.slo_from`): judge against exactly the limits it judged
against, so that two searches compare their knees and not two SLOs.

A scaled SLO (`scaled`) is one moment's: on a shared VM two searches an hour apart scale
their limits from floors of different speeds, so the second search's knees move with its SLO
as much as with its probes. A repeat of a search therefore takes the limits its
`search.json` records (every `slo.*` limit, set or null, replaced: no limit of this search's
own configuration is mixed in) and keeps the attainment share it asked, refusing another.
The reference floor still runs before the first probe and after the last (the drift within
this search), and its median TPOT is set beside the earlier search's reference floor: how
much faster or slower this machine is than when the limits were scaled, which moves every
knee by about as much.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, open_dict

from servelab.base.errors import ConfigError
from servelab.harness.measure.drift import Drift
from servelab.harness.measure.slo.limits import LIMITS, PER_PROMPT_TOKEN, SLO

SLO_KEYS = (*LIMITS, PER_PROMPT_TOKEN)
FIELD = "search.slo_from"


def with_slo(cfg: DictConfig, values: Mapping[str, float | None]) -> DictConfig:
    """A copy of `cfg` with each `slo.KEY` of `values` set (None: no such limit), whatever
    the command line gave it: the one place a search replaces limits."""
    changed = copy.deepcopy(cfg)
    with open_dict(changed.slo):
        for key, value in values.items():
            changed.slo[key] = value
    return changed


def judged_record(slo: SLO) -> dict[str, float | None]:
    """What `search.json` records of the SLO its probes were judged against."""
    return {**{key: getattr(slo, key) for key in SLO_KEYS}, "attainment": slo.attainment}


@dataclass(frozen=True)
class SourceSLO:
    """The SLO an earlier search judged against, and its reference floor's speed."""

    path: Path  # its search.json
    limits: dict[str, float | None]  # every `slo.*` limit key, None where it set none
    attainment: float
    reference_strategy: str  # whose floor was its reference
    reference_tpot_s: float | None  # that floor's median TPOT before its first probe

    def line(self) -> str:
        return f"SLO from {self.path}: {SLO(**self.limits, attainment=self.attainment).describe()}"

    def speed_against(self, strategy: str, reference: dict) -> SourceSpeed | None:
        """This search's reference floor beside the source's: None unless both are the same
        strategy's and both measured a TPOT."""
        now = (reference.get("tpot") or {}).get("p50")
        if strategy != self.reference_strategy or self.reference_tpot_s is None:
            return None
        if not isinstance(now, int | float) or now <= 0:
            return None
        return SourceSpeed(self.reference_tpot_s, float(now))


class SourceSpeed(Drift):
    """The reference floor's median TPOT when the limits were scaled, and before this search's
    first probe."""

    def line(self) -> str:
        return (
            f"machine speed against the search the SLO is from: one request at a time, median "
            f"TPOT {self.before_s * 1e3:.3g} ms then, {self.after_s * 1e3:.3g} ms now "
            f"({self.change:+.1%}); a slower machine sustains less under the same limits, and "
            "every knee moves with it"
        )


def read_source(given: str, attainment: float) -> SourceSLO:
    """The SLO recorded by the search at `given` (its out_dir, or its search.json)."""
    path = Path(given)
    if path.is_dir():
        path = path / "search.json"
    if not path.is_file():
        raise ConfigError(FIELD, f"{path} does not exist; give a search's out_dir")
    record = json.loads(path.read_text())
    slo = record.get("slo")
    if not isinstance(slo, dict):
        raise ConfigError(FIELD, f"{path} records no SLO (written before searches recorded it)")
    try:
        judged = SLO.from_config(slo)
    except ConfigError as error:
        raise ConfigError(FIELD, f"{path}: {error}") from error
    if not judged.configured:
        raise ConfigError(FIELD, f"{path} records an SLO without limits")
    if judged.attainment != attainment:
        raise ConfigError(
            FIELD,
            f"{path} asked {judged.attainment:g} of requests to meet its SLO and this search "
            f"{attainment:g}; give +slo.attainment={judged.attainment:g} to repeat it",
        )
    strategies = (record.get("settings") or {}).get("strategies") or [""]
    before = (record.get("drift") or {}).get("before_s")
    return SourceSLO(
        path,
        {key: getattr(judged, key) for key in SLO_KEYS},
        judged.attainment,
        str(strategies[0]),
        float(before) if isinstance(before, int | float) else None,
    )
