"""The run directory's writer and its one reader: records appended as they happen, the summary
written atomically, records read back the same way by `summarize` and the reports. A run
itself takes its records as it wrote them (`RunWriter(keep=True).written()`): reading back a
long simulated run's 850,000 step lines cost a sixth of it, to rebuild what it held already;
a test pins that the summary from disk is the same.

`requests.jsonl` gets a line when a request finishes, `steps.jsonl` a line per engine step.
Each line goes to the file in one `write` call on a descriptor opened for appending (no
buffer in between that could split it), so a process killed at any instant leaves every
line it wrote whole: a crash keeps everything measured up to it, and no torn line. The reader
still leaves out an unterminated last line (a full disk can cut one) and any line that does
not parse as its record, and counts them (`read_records`). `summary.json` is written to a
temporary file and renamed into place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from harness.records import RequestRecord, StepRecord

SCHEMA_VERSION = 2


def write_json_atomic(path: Path, payload: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)


def torn_tail(path: Path) -> bool:
    """Does the file end in an unterminated (torn) line?"""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


REQUESTS = "requests.jsonl"
STEPS = "steps.jsonl"


class Parsed(Protocol):
    @classmethod
    def from_json(cls, payload: dict) -> Parsed: ...


R = TypeVar("R", bound=Parsed)


def read_records(path: Path, kind: type[R]) -> tuple[list[R], int]:
    """Every whole line of a records file that parses as `kind`, and how many lines were left
    out (a torn last line, or a line that is not such a record)."""
    if not path.is_file():
        return [], 0
    *lines, tail = path.read_text().split("\n")  # the part after the last newline is torn
    records: list[R] = []
    skipped = 1 if tail.strip() else 0
    for line in lines:
        if not line.strip():
            continue
        try:
            records.append(kind.from_json(json.loads(line)))
        except (json.JSONDecodeError, TypeError, AttributeError):
            skipped += 1
    return records, skipped


def read_requests(run_dir: Path) -> list[RequestRecord]:
    return read_records(run_dir / REQUESTS, RequestRecord)[0]


def read_steps(run_dir: Path) -> list[StepRecord]:
    return read_records(run_dir / STEPS, StepRecord)[0]


@dataclass
class RunRecords:
    """A run directory's records read once, for everything after the run that needs them (its
    summary, its flags, its report): a long simulated run's steps took seconds per reading."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    skipped_requests: int  # lines of requests.jsonl left out (torn or not a record)
    skipped_steps: int

    @classmethod
    def read(cls, run_dir: Path) -> RunRecords:
        requests, skipped_requests = read_records(run_dir / REQUESTS, RequestRecord)
        steps, skipped_steps = read_records(run_dir / STEPS, StepRecord)
        return cls(requests, steps, skipped_requests, skipped_steps)


class RunWriter:
    """Appends a run's records to its directory; with `keep`, also holds them (`written`), for
    a run's own summary and report (a server writing for days keeps none)."""

    def __init__(self, run_dir: Path, keep: bool = False) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests = _open_append(run_dir / REQUESTS)
        self._steps = _open_append(run_dir / STEPS)
        self._kept: RunRecords | None = RunRecords([], [], 0, 0) if keep else None

    def request(self, record: RequestRecord) -> None:
        _write_line(self._requests, record.to_json())
        if self._kept is not None:
            self._kept.requests.append(record)

    def step(self, record: StepRecord) -> None:
        _write_line(self._steps, record.to_json())
        if self._kept is not None:
            self._kept.steps.append(record)

    def written(self) -> RunRecords:
        """Every record written so far, as written (a writer made with `keep`)."""
        if self._kept is None:
            raise RuntimeError("this writer keeps no records: make it with keep=True")
        return self._kept

    def json(self, name: str, payload: dict) -> None:
        write_json_atomic(self.run_dir / name, payload)

    def close(self) -> None:
        for descriptor in (self._requests, self._steps):
            os.close(descriptor)


def _open_append(path: Path) -> int:
    """A fresh, empty file, opened for appending without a buffer."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)


def _write_line(descriptor: int, payload: dict) -> None:
    """One JSON line in one write (the kernel appends it whole); a short write, which only a
    full disk or a signal can cause, continues with the rest."""
    data = (json.dumps(payload) + "\n").encode()
    while data:
        data = data[os.write(descriptor, data) :]
