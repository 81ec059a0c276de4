"""Read run directories into typed `RunData`, tolerating runs that crashed part-way.

A run directory holds `config.yaml`, `meta.json`, `requests.jsonl`, `steps.jsonl`,
`telemetry.csv` and, once the run finished, `summary.json` (see DESIGN.md, "Run directory").
Reports read only these files, never the engine. Lines are appended while a run goes, so a
crash can leave a truncated last line or no summary: such a run still loads, marked
incomplete, with every problem noted in `RunData.problems`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord, StepRecord, fixed_fields
from servelab.harness.measure.rundir import REQUESTS, STEPS, RunRecords
from servelab.harness.measure.server_metrics import FILE as SERVER_METRICS

SUMMARY = "summary.json"
TELEMETRY = "telemetry.csv"
META = "meta.json"
CONFIG_CANDIDATES = ("config.yaml", ".hydra/config.yaml")


@dataclass
class RunData:
    """Everything one run directory recorded; optional parts are empty, never missing."""

    path: Path
    config: dict[str, Any]
    meta: dict[str, Any]
    summary: dict[str, Any] | None
    request_records: list[RequestRecord]
    step_records: list[StepRecord]
    telemetry: pd.DataFrame
    server_metrics: pd.DataFrame  # an endpoint run's scrape of the server's /metrics
    problems: list[str] = field(default_factory=list)

    @property
    def requests(self) -> pd.DataFrame:
        """The request records as a table, one column per field (empty without records)."""
        return records_frame(self.request_records)

    @property
    def steps(self) -> pd.DataFrame:
        """The step records as a table, counters as columns (empty without records)."""
        return records_frame(self.step_records)

    @property
    def status(self) -> str:
        """`complete`; `failed` (summary written after an error); `stopped` (ended early once
        its SLO verdict could only be a failure, `slo.stop_early`); `incomplete` (no summary,
        or one rebuilt from the records of a run that stopped before writing its own)."""
        if self.summary is None:
            return "incomplete"
        status = self.summary.get("status")
        return status if status in ("failed", "stopped", "incomplete") else "complete"

    @property
    def complete(self) -> bool:
        """Complete: the run finished and wrote its summary without an error."""
        return self.status == "complete"

    @property
    def strategy(self) -> dict[str, Any]:
        """What served the run: the strategy section of the config (axes and name), or, for a
        peer backend (an HTTP endpoint, transformers), what meta.json says it was; possibly
        empty."""
        if self.config.get("backend", "inprocess") != "inprocess":
            return as_dict(self.meta.get("strategy"))
        return as_dict(self.config.get("strategy"))

    @property
    def strategy_name(self) -> str:
        """The strategy's name: from the config, else the summary, else `unknown`."""
        name = self.strategy.get("name")
        if name is None and self.summary is not None:
            named = self.summary.get("strategy")
            name = as_dict(named).get("name") if isinstance(named, dict) else named
        return str(name) if name is not None else "unknown"

    @property
    def workload(self) -> dict[str, Any]:
        """The workload section of the config, possibly empty."""
        return as_dict(self.config.get("workload"))

    @property
    def workload_name(self) -> str:
        """The workload's name: from the config, else the summary, else `unknown`."""
        name = self.workload.get("name")
        if name is None and self.summary is not None:
            named = self.summary.get("workload")
            name = as_dict(named).get("name") if isinstance(named, dict) else named
        return str(name) if name is not None else "unknown"

    @property
    def arrival(self) -> dict[str, Any]:
        """The workload's arrival section (`process`, `rate`, `concurrency`), possibly empty."""
        return as_dict(self.workload.get("arrival"))

    @property
    def model_name(self) -> str:
        """The model's name from the config, else the summary, else `unknown`."""
        name = as_dict(self.config.get("model")).get("name")
        if name is None and self.summary is not None:
            name = self.summary.get("model")
        return str(name) if name is not None else "unknown"

    @property
    def slo(self) -> dict[str, Any]:
        """The SLO limits from the config (`ttft_s`, `tpot_s`, `e2e_s`, ...), possibly empty."""
        return as_dict(self.config.get("slo"))


def records_frame(records: Sequence[RequestRecord] | Sequence[StepRecord]) -> pd.DataFrame:
    """Records as a table: one column per field, then one per counter in the order first met,
    NaN where a record has none; the table of their JSON lines, built a column at a time (a
    long simulated run's 550,000 steps took 5 s as a list of dicts) from each record's fields
    read in one visit (a visit per field and record took a third longer)."""
    if not records:
        return pd.DataFrame()
    names = fixed_fields(type(records[0]))
    fields = zip(*map(attrgetter(*names), records), strict=True)  # the rows, transposed
    columns = {
        name: _column(list(values), "biufU") for name, values in zip(names, fields, strict=True)
    }
    counters = [record.counters for record in records]
    for key in dict.fromkeys(chain.from_iterable(counters)):
        columns[key] = _column([counts.get(key, math.nan) for counts in counters], "biuf")
    return pd.DataFrame(columns)


def _column(values: list[Any], kinds: str) -> Any:
    """A column's values as one numpy array where they make one of these kinds (numpy's
    letters: numbers, strings); as they are otherwise (None, lists), for pandas to infer as
    it would from JSON."""
    try:
        array = np.asarray(values)
    except ValueError:  # lists of different lengths
        return values
    return array if array.ndim == 1 and array.dtype.kind in kinds else values


def as_dict(value: Any) -> dict[str, Any]:
    """`value` if it is a mapping, else an empty dict: config sections may be absent."""
    return dict(value) if isinstance(value, dict) else {}


def is_run_dir(path: Path) -> bool:
    """A run directory has a summary, or at least a requests file (a crashed run)."""
    return (path / SUMMARY).is_file() or (path / REQUESTS).is_file()


def find_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Every run directory at or below `paths`, sorted, each once.

    Raises ConfigError when a path does not exist, so a typo fails before any work.
    """
    found: set[Path] = set()
    for path in paths:
        if not path.exists():
            raise ConfigError("paths", f"{path} does not exist; pass a run or sweep directory")
        if path.is_file():
            path = path.parent
        if is_run_dir(path):
            found.add(path.resolve())
        for marker in (SUMMARY, REQUESTS):
            found.update(p.parent.resolve() for p in path.rglob(marker))
    return sorted(found)


def load_run(path: Path, records: RunRecords | None = None) -> RunData:
    """Read one run directory; missing or damaged parts become empty and are noted.
    `records`: its records when they were read already (they are not read again)."""
    if not is_run_dir(path):
        raise ConfigError(
            "run_dir", f"{path} has neither {SUMMARY} nor {REQUESTS}; pass a run directory"
        )
    problems: list[str] = []
    summary = _read_json(path / SUMMARY, problems)
    if summary is None:
        problems.append(f"no {SUMMARY}: the run did not finish; figures show what was recorded")
    records = RunRecords.read(path) if records is None else records
    for name, skipped in ((REQUESTS, records.skipped_requests), (STEPS, records.skipped_steps)):
        if skipped:
            problems.append(f"{name}: skipped {skipped} unreadable line(s)")
    return RunData(
        path=path,
        config=_read_config(path, problems),
        meta=_read_json(path / META, problems) or {},
        summary=summary,
        request_records=records.requests,
        step_records=records.steps,
        telemetry=_read_csv(path / TELEMETRY, problems),
        server_metrics=_read_csv(path / SERVER_METRICS, problems),
        problems=problems,
    )


def _read_config(path: Path, problems: list[str]) -> dict[str, Any]:
    for name in CONFIG_CANDIDATES:
        candidate = path / name
        if candidate.is_file():
            try:
                return as_dict(yaml.safe_load(candidate.read_text()))
            except yaml.YAMLError as exc:
                problems.append(f"{name} unreadable: {exc}")
                return {}
    problems.append("no config.yaml")
    return {}


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        problems.append(f"{path.name} unreadable: {exc}")
        return None
    return as_dict(loaded)


def _read_csv(path: Path, problems: list[str]) -> pd.DataFrame:
    if not path.is_file() or path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        return pd.read_csv(path, on_bad_lines="skip")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name} unreadable: {exc}")
        return pd.DataFrame()
