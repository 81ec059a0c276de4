"""Requests that missed the SLO at every rate a search probed are named, per workload seed,
with the line the search prints."""

from __future__ import annotations

import json
from pathlib import Path

from servelab.harness.records import RequestRecord
from servelab.harness.search.always_missed import AlwaysMissed, always_missed, always_missed_line


def probe(root: Path, name: str, seed: int, ttfts: dict[str, float]) -> Path:
    """A completed rate probe's run directory: requests arriving at 0 whose first token came
    `ttfts[id]` seconds later (prompt length 10 x the id's length), under a 0.5 s TTFT limit."""
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(f"workload: {{seed: {seed}}}\nslo: {{ttft_s: 0.5}}\n")
    lines = []
    for request_id, ttft in ttfts.items():
        record = RequestRecord(
            id=request_id,
            prompt_len=10 * len(request_id),
            output_len=2,
            t_scheduled=0.0,
            token_times=[ttft, ttft + 0.01],
            output_ids=[1, 2],
            finish_reason="length",
            t_done=ttft + 0.01,
        )
        lines.append(json.dumps(record.to_json()) + "\n")
    (run_dir / "requests.jsonl").write_text("".join(lines))
    return run_dir


def test_a_request_missing_at_every_rate_of_its_seed_is_named(tmp_path: Path) -> None:
    probes = [
        (0.4, probe(tmp_path, "a", 0, {"1": 0.1, "29": 0.7, "3": 0.9})),
        (0.2, probe(tmp_path, "b", 0, {"1": 0.1, "29": 0.6, "3": 0.2})),
        (0.3, probe(tmp_path, "c", 1, {"1": 0.1, "29": 0.1})),  # a repeat: other requests
    ]
    found = always_missed(probes)
    assert found == [AlwaysMissed("29", 20, 2, 0.2, 0.6)]
    assert always_missed_line(found) == (
        "missed the SLO in all 2 completed rate probes, whatever the load: request 29 (20 "
        "prompt tokens, TTFT 0.6 s at 0.2 req/s). A probe of n such requests meets the SLO "
        "for at most n - 1, so near the target its verdict reads their length, not the load; "
        "a looser limit (search.slo_scale) or a workload without them separates the two."
    )


def test_a_request_that_met_the_slo_once_or_was_not_in_every_probe_is_not_named(
    tmp_path: Path,
) -> None:
    probes = [
        (0.4, probe(tmp_path, "a", 0, {"1": 0.9, "2": 0.9})),
        (0.2, probe(tmp_path, "b", 0, {"1": 0.1})),
    ]
    assert always_missed(probes) == []
    assert always_missed([]) == [] and always_missed_line([]) == ""
