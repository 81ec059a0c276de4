"""Quality records of served weights, kept in the cache beside the weights they describe.

Quality is measured once per served checkpoint, not in every run: `servelab quantize`
records the perplexity of the quantised and the dense weights on held-out text and the share
of requests whose greedy outputs equal dense's; `servelab perplexity` records what it
measures. A record lives in `CACHE/quality/WEIGHTS_ID.json` (`WEIGHTS_ID` names checkpoint,
head layout and weights settings), and a run copies the record of the weights it served into
its summary (`weights`), so that reports show quality beside throughput.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

QUALITY_DIR = "quality"


def quality_path(cache_dir: Path, weights_id: str) -> Path:
    return cache_dir / QUALITY_DIR / f"{weights_id}.json"


def read_quality(cache_dir: Path, weights_id: str) -> dict[str, Any]:
    """The record of `weights_id` (empty when nothing was measured yet)."""
    path = quality_path(cache_dir, weights_id)
    return json.loads(path.read_text()) if path.is_file() else {}


def record_quality(cache_dir: Path, weights_id: str, updates: dict[str, Any]) -> Path:
    """Merge `updates` into the record (perplexities by dtype); written atomically."""
    record = read_quality(cache_dir, weights_id)
    perplexity = record.get("perplexity", {}) | updates.pop("perplexity", {})
    record.update(updates)
    if perplexity:
        record["perplexity"] = perplexity
    path = quality_path(cache_dir, weights_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}")
    staging.write_text(json.dumps(record, indent=2))
    staging.replace(path)
    return path


def perplexity_entry(value: float, tokens: int, windows: int) -> dict[str, Any]:
    return {"value": value, "tokens": tokens, "windows": windows, "text": "evaluation"}


def weights_summary(
    option: str,
    weights_id: str,
    weight_bytes: int,
    made: dict[str, Any] | None,
    quality: dict[str, Any],
) -> dict[str, Any]:
    """What a run records about the weights it served: the option, bytes read per forward,
    how they were made (settings, calibration time and memory) and their measured quality."""
    fp32 = quality.get("perplexity", {}).get("fp32", {})
    agreement = quality.get("greedy_agreement", {})
    made = made or {}
    return {
        "option": option,
        "weights_id": weights_id,
        "weight_bytes": weight_bytes,
        "perplexity_fp32": fp32.get("value"),
        "perplexity_tokens": fp32.get("tokens"),
        "greedy_agreement": agreement.get("identical_share"),
        "made": {
            key: made[key]
            for key in ("method", "group_size", "seconds", "peak_rss_bytes", "folder")
            if key in made
        },
    }
