"""The run directory writer: append records as they happen, write the summary atomically.

`requests.jsonl` gets a line when a request finishes, `steps.jsonl` a line per engine step.
Each line goes to the file in one `write` call on a descriptor opened for appending (no
buffer in between that could split it), so a process killed at any instant leaves every
line it wrote whole: a crash keeps everything measured up to it, and no torn line. Readers
still ignore an unterminated last line (a full disk can cut one). `summary.json` is written
to a temporary file and renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.records import RequestRecord, StepRecord

SCHEMA_VERSION = 2


def write_json_atomic(path: Path, payload: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a records file (an unterminated last line is left out)."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]  # the part after the last newline is not whole
    return [json.loads(line) for line in lines if line.strip()]


def torn_tail(path: Path) -> bool:
    """Does the file end in an unterminated (torn) line?"""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def read_requests(run_dir: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(line) for line in read_jsonl(run_dir / "requests.jsonl")]


def read_steps(run_dir: Path) -> list[StepRecord]:
    return [StepRecord.from_json(line) for line in read_jsonl(run_dir / "steps.jsonl")]


class RunWriter:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests = _open_append(run_dir / "requests.jsonl")
        self._steps = _open_append(run_dir / "steps.jsonl")

    def request(self, record: RequestRecord) -> None:
        _write_line(self._requests, record.to_json())

    def step(self, record: StepRecord) -> None:
        _write_line(self._steps, record.to_json())

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
