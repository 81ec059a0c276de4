"""scripts/peers/agreement.py: greedy agreement between a servelab run and a peer's output ids."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "peers" / "agreement.py"


@pytest.fixture(scope="module")
def agreement() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agreement", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_run_directory_against_vllm_offline_json(agreement: ModuleType, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    ours = [([1, 2, 3, 4], 5), ([5, 6, 7, 8], 3), ([9, 9], 2)]
    lines = [
        json.dumps({"id": str(i), "prompt_len": n, "output_ids": ids})
        for i, (ids, n) in enumerate(ours)
    ]
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    theirs = [[1, 2, 3, 4], [5, 6, 0, 8], [9]]
    peer = tmp_path / "vllm.json"
    peer.write_text(
        json.dumps(
            {
                "requests": [
                    {"id": str(i), "prompt_len": ours[i][1], "output_ids": ids}
                    for i, ids in enumerate(theirs)
                ]
            }
        )
    )
    result = agreement.compare(agreement.load(run), agreement.load(peer))
    assert result["requests"] == 3
    assert result["identical_share"] == pytest.approx(1 / 3, abs=1e-4)
    assert result["tokens_before_first_difference_share"] == pytest.approx(7 / 10)
    # the second request differs at 2, the third ([9, 9] against [9]) at 1
    assert result["first_difference_quartiles"] == [1.25, 1.5, 1.75]


def test_different_prompts_are_refused(agreement: ModuleType) -> None:
    a = {"0": {"prompt_len": 5, "output_ids": [1]}}
    b = {"0": {"prompt_len": 6, "output_ids": [1]}}
    with pytest.raises(ValueError, match="not the same workload"):
        agreement.compare(a, b)
