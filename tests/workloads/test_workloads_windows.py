"""Warm-up and cool-down: which requests are excluded from the metrics, by count or time."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerBase

from servelab.workloads.build import build_workload
from servelab.workloads.windows import WindowSpec, mark_excluded

TIMES = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
NONE = WindowSpec()


def test_by_count() -> None:
    marks = mark_excluded(TIMES, WindowSpec(requests=2), WindowSpec(requests=3))
    assert marks == [True, True, False, False, False, True, True, True]


def test_by_time() -> None:
    marks = mark_excluded(TIMES, WindowSpec(seconds=1.5), WindowSpec(seconds=2.5))
    assert marks == [True, True, False, False, False, True, True, True]


def test_nothing_excluded_by_default() -> None:
    assert mark_excluded(TIMES, NONE, NONE) == [False] * 8
    assert mark_excluded([0.0] * 4, WindowSpec(requests=1), NONE) == [True, False, False, False]


@pytest.mark.integration
def test_marked_in_the_built_workload(tokenizer: PreTrainedTokenizerBase) -> None:
    cfg = OmegaConf.create(
        {
            "name": "windows",
            "num_requests": 10,
            "input_len": {"dist": "fixed", "value": 8},
            "output_len": {"dist": "fixed", "value": 4},
            "prompt": {"source": "random"},
            "arrival": {"process": "constant", "rate": 1.0},
            "warmup": {"seconds": 2.5},
            "cooldown": {"requests": 2},
        }
    )
    workload = build_workload(cfg, tokenizer, 64)
    assert [r.arrival for r in workload.requests] == [float(i) for i in range(10)]
    assert [r.excluded for r in workload.requests] == [True] * 3 + [False] * 5 + [True] * 2
    cfg.cooldown = {"requests": 0}
    assert sum(r.excluded for r in build_workload(cfg, tokenizer, 64).requests) == 3
