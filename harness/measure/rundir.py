"""The run directory's writer and its one reader: records appended as they happen, the summary
written atomically, records read back the same way by `summarize` and the reports. A run
itself takes its records as it wrote them (`RunWriter(keep=True).written()`): reading back a
long simulated run's 850,000 step lines cost a sixth of it, to rebuild what it held already;
a test pins that the summary from disk is the same.

`requests.jsonl` gets a line when a request finishes, `steps.jsonl` a line per engine step,
encoded by orjson (a tenth of the standard encoder's time: at a simulated run's hundreds of
thousands of steps the standard one took a third of the run). Each line goes to the file in
one `write` call on a descriptor opened for appending (no buffer in between that could split
it), so a process killed at any instant leaves every line it wrote whole: a crash keeps
everything measured up to it, and no torn line. A simulated run, which a rerun reproduces
exactly, writes whole lines in batches instead (`RunWriter.batched`): a write call per line
was a sixth of its time. The reader
still leaves out an unterminated last line (a full disk can cut one) and any line that does
not parse as its record, and counts them (`read_records`). `summary.json` is written to a
temporary file and renamed into place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson

from servelab.base.records import RequestRecord, StepRecord

SCHEMA_VERSION = 2
BATCH_BYTES = 1 << 20  # what a batched writer holds before it writes
LINE_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY  # how a line is encoded


def read_json(path: Path) -> dict | None:
    """A run directory's JSON record, None where it is missing, torn or not an object."""
    if not path.is_file():
        return None
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return loaded if isinstance(loaded, dict) else None


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
            records.append(kind.from_json(orjson.loads(line)))
        except (orjson.JSONDecodeError, TypeError, AttributeError):
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
        self._requests = LineFile(run_dir / REQUESTS)
        self._steps = LineFile(run_dir / STEPS)
        self._kept: RunRecords | None = RunRecords([], [], 0, 0) if keep else None

    def request(self, record: RequestRecord) -> None:
        self._requests.write(encode_line(record.to_json()))
        if self._kept is not None:
            self._kept.requests.append(record)

    def step(self, record: StepRecord) -> None:
        self._steps.write(encode_line(record.to_json()))
        if self._kept is not None:
            self._kept.steps.append(record)

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Within: whole lines are written a batch at a time (`BATCH_BYTES`), the rest when
        it ends, however it ends; a process killed within loses the lines of the last batch,
        never part of one."""
        files = (self._requests, self._steps)
        for file in files:
            file.batch = True
        try:
            yield
        finally:
            for file in files:
                file.batch = False
                file.flush()

    def written(self) -> RunRecords:
        """Every record written so far, as written (a writer made with `keep`)."""
        if self._kept is None:
            raise RuntimeError("this writer keeps no records: make it with keep=True")
        return self._kept

    def json(self, name: str, payload: dict) -> None:
        write_json_atomic(self.run_dir / name, payload)

    def close(self) -> None:
        for file in (self._requests, self._steps):
            file.close()


def encode_line(payload: dict[str, Any]) -> bytes:
    """One record's JSON line, newline included."""
    return orjson.dumps(payload, option=LINE_OPTIONS)


class LineFile:
    """A fresh, empty file, opened for appending without a buffer: each line in one write
    (the kernel appends it whole), or, while `batch` is set, whole lines a batch at a time."""

    def __init__(self, path: Path) -> None:
        self.descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.batch = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, line: bytes) -> None:
        if not self.batch:
            _write_all(self.descriptor, line)
            return
        self._pending.append(line)
        self._pending_bytes += len(line)
        if self._pending_bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            _write_all(self.descriptor, b"".join(self._pending))
        self._pending, self._pending_bytes = [], 0

    def close(self) -> None:
        self.flush()
        os.close(self.descriptor)


def _write_all(descriptor: int, data: bytes) -> None:
    """`data` in one write; a short write, which only a full disk or a signal can cause,
    continues with the rest."""
    while data:
        data = data[os.write(descriptor, data) :]
