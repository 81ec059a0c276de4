"""Request traces: arrival time, input tokens and output tokens per request, from CSV or JSONL.

Accepted column names, as the public traces spell them:

| | servelab | Azure LLM inference trace | BurstGPT |
|---|---|---|---|
| time | `timestamp` | `TIMESTAMP` (date and time) | `Timestamp` (seconds) |
| input tokens | `input_tokens` | `ContextTokens` | `Request tokens` |
| output tokens | `output_tokens` | `GeneratedTokens` | `Response tokens` |

Times are numbers of seconds or `YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]` date-times; the
replay clock starts at the first row. Rows must be in time order. `time_scale` k replays
k times faster; `max_requests` keeps the first N rows, `max_seconds` the rows whose replay
time is below T. Rows with 0 input or output tokens (failed requests in BurstGPT) stop the
build unless `drop_empty` is set.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from servelab.base.errors import ConfigError
from servelab.workloads.fields import Node, Where
from servelab.workloads.spec import Workload

TIME_COLUMNS = ("timestamp", "TIMESTAMP", "Timestamp")
INPUT_COLUMNS = ("input_tokens", "ContextTokens", "Request tokens")
OUTPUT_COLUMNS = ("output_tokens", "GeneratedTokens", "Response tokens")
TRACE_COLUMNS = (TIME_COLUMNS[0], INPUT_COLUMNS[0], OUTPUT_COLUMNS[0])
TRACE_KEYS = ("path", "time_scale", "max_requests", "max_seconds", "drop_empty")
CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_DATETIME = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})?$")
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class TraceSpec:
    """Which trace to replay and how much of it."""

    path: str | None = None
    time_scale: float = 1.0  # k: replay k times faster
    max_requests: int | None = None  # keep the first N rows
    max_seconds: float | None = None  # keep rows scheduled before T seconds (after scaling)
    drop_empty: bool = False  # skip rows with 0 input or output tokens


def parse_trace_spec(value: object, path: str) -> TraceSpec:
    """Read and check the `workload.trace` node."""
    node = Node.of(value, path, TRACE_KEYS)
    max_seconds = node.optional_number("max_seconds")
    if max_seconds is not None and max_seconds <= 0:
        raise ConfigError(node.field("max_seconds"), f"is {max_seconds}; it must be above 0")
    return TraceSpec(
        path=node.optional_text("path"),
        time_scale=node.positive("time_scale", default=1.0),
        max_requests=node.optional_integer("max_requests", minimum=1),
        max_seconds=max_seconds,
        drop_empty=node.flag("drop_empty", default=False),
    )


@dataclass(frozen=True)
class TraceRows:
    """A trace's rows: times in seconds from the first row, and token counts."""

    times: tuple[float, ...]
    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]


def read_trace(path: Path, field: str, drop_empty: bool = False) -> TraceRows:
    """Read, check and convert a trace file; errors name `field` and the line."""
    if not path.is_file():
        raise ConfigError(field, f"{path} does not exist; give an existing trace file")
    rows = list(_rows(path, field))
    if not rows:
        raise ConfigError(field, f"{path} has no rows; give a trace with at least one request")
    columns = [
        _column(rows[0][1], names, path, field)
        for names in (TIME_COLUMNS, INPUT_COLUMNS, OUTPUT_COLUMNS)
    ]
    stamps: list[tuple[int, float]] = []
    inputs: list[int] = []
    outputs: list[int] = []
    for line, row in rows:
        where = Where(field, f"{path} line {line}")
        values = [row.get(name) for name in columns]
        tokens_in = _count(values[1], columns[1], where)
        tokens_out = _count(values[2], columns[2], where)
        if min(tokens_in, tokens_out) == 0:
            if drop_empty:
                continue
            raise where.error(
                "0 input or output tokens; set workload.trace.drop_empty=true to skip such rows"
            )
        stamp = _stamp(values[0], columns[0], where)
        if stamps and _seconds(stamp, stamps[0]) < _seconds(stamps[-1], stamps[0]):
            raise where.error("earlier than the row before; sort the trace by time")
        stamps.append(stamp)
        inputs.append(tokens_in)
        outputs.append(tokens_out)
    if not stamps:
        raise ConfigError(field, f"{path} has no rows with tokens in and out")
    times = tuple(_seconds(stamp, stamps[0]) for stamp in stamps)
    return TraceRows(times=times, input_tokens=tuple(inputs), output_tokens=tuple(outputs))


def _rows(path: Path, field: str) -> Iterator[tuple[int, dict[str, object]]]:
    suffix = path.suffix.lower()
    with path.open(newline="", encoding="utf-8") as handle:
        if suffix in CSV_SUFFIXES:
            for line, row in enumerate(csv.DictReader(handle), 2):
                yield line, dict(row)
        elif suffix in JSONL_SUFFIXES:
            for line, text in enumerate(handle, 1):
                if text.strip():
                    yield line, _json_object(text, Where(field, f"{path} line {line}"))
        else:
            known = ", ".join(CSV_SUFFIXES + JSONL_SUFFIXES)
            raise ConfigError(field, f"{path} has an unknown suffix; use one of {known}")


def _json_object(text: str, where: Where) -> dict[str, object]:
    try:
        item = json.loads(text)
    except json.JSONDecodeError as error:
        raise where.error(f"not valid JSON ({error.msg})") from error
    if not isinstance(item, dict):
        raise where.error("each line must be a JSON object")
    return item


def _column(row: dict[str, object], names: tuple[str, ...], path: Path, field: str) -> str:
    for name in names:
        if name in row:
            return name
    raise ConfigError(field, f"{path} has no column {' / '.join(repr(n) for n in names)}")


def _count(value: object, column: str, where: Where) -> int:
    number = _number(value)
    if number is None or number < 0 or number != int(number):
        raise where.error(f"{column} is {value!r}; it must be a whole number >= 0")
    return int(number)


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        try:
            number = float(str(value))
        except ValueError:
            return None
    return number if math.isfinite(number) else None


def _stamp(value: object, column: str, where: Where) -> tuple[int, float]:
    """A time as whole seconds since 1970 plus a fraction (numbers: 0 plus the number)."""
    number = _number(value)
    if number is not None:
        return 0, number
    match = _DATETIME.match(str(value).strip())
    if match is None:
        raise where.error(f"{column} is {value!r}; give seconds or a date-time")
    day, clock, fraction, zone = match.groups()
    zone = "+00:00" if zone == "Z" else zone or ""
    if len(zone) == 5:
        zone = f"{zone[:3]}:{zone[3:]}"
    moment = datetime.fromisoformat(f"{day}T{clock}{zone}")
    epoch = _EPOCH_UTC if moment.tzinfo else _EPOCH_NAIVE
    return int((moment - epoch).total_seconds()), float(f"0{fraction}" if fraction else 0)


def _seconds(stamp: tuple[int, float], origin: tuple[int, float]) -> float:
    return (stamp[0] - origin[0]) + (stamp[1] - origin[1])


def replay_count(times: tuple[float, ...] | list[float], spec: TraceSpec) -> int:
    """How many leading rows the truncation keeps."""
    count = len(times) if spec.max_requests is None else min(len(times), spec.max_requests)
    if spec.max_seconds is not None:
        limit = spec.max_seconds * spec.time_scale
        count = min(count, int(np.searchsorted(np.asarray(times), limit, side="left")))
    return count


def write_trace(workload: Workload, path: Path) -> None:
    """Write a workload's schedule and lengths as a trace (CSV or JSONL, by suffix)."""
    rows = [
        {
            TRACE_COLUMNS[0]: request.arrival,
            TRACE_COLUMNS[1]: len(request.prompt_ids),
            TRACE_COLUMNS[2]: request.max_tokens,
        }
        for request in workload.requests
    ]
    suffix = path.suffix.lower()
    with path.open("w", newline="", encoding="utf-8") as handle:
        if suffix in CSV_SUFFIXES:
            writer = csv.DictWriter(handle, fieldnames=list(TRACE_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)
        elif suffix in JSONL_SUFFIXES:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
        else:
            raise ValueError(f"unknown trace suffix {path.suffix!r}; use .csv or .jsonl")
