"""The run directory writer: append records as they happen, write the summary atomically.

`requests.jsonl` gets a line when a request finishes, `steps.jsonl` a line per engine step,
each flushed at once, so a crash keeps everything measured up to it. `summary.json` is
written to a temporary file and renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO

from harness.records import RequestRecord, StepRecord

SCHEMA_VERSION = 2


def write_json_atomic(path: Path, payload: dict) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    os.replace(partial, path)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_requests(run_dir: Path) -> list[RequestRecord]:
    return [RequestRecord.from_json(line) for line in read_jsonl(run_dir / "requests.jsonl")]


def read_steps(run_dir: Path) -> list[StepRecord]:
    return [StepRecord.from_json(line) for line in read_jsonl(run_dir / "steps.jsonl")]


class RunWriter:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._requests: IO[str] = (run_dir / "requests.jsonl").open("w")
        self._steps: IO[str] = (run_dir / "steps.jsonl").open("w")

    def request(self, record: RequestRecord) -> None:
        self._requests.write(json.dumps(record.to_json()) + "\n")
        self._requests.flush()

    def step(self, record: StepRecord) -> None:
        self._steps.write(json.dumps(record.to_json()) + "\n")
        self._steps.flush()

    def json(self, name: str, payload: dict) -> None:
        write_json_atomic(self.run_dir / name, payload)

    def close(self) -> None:
        self._requests.close()
        self._steps.close()
