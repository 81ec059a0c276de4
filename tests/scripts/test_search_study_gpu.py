"""The search's benchmark at a GPU's speed (`scripts.search_study_gpu`): its setups are
`make run`'s at the simulator's H100, and a true knee is lengthened until two draws agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import search_study_gpu as gpu


def test_the_embedded_setup_is_make_runs_comparison_on_the_h100_preset() -> None:
    embedded = gpu.setup_overrides("embedded")
    assert embedded[-2:] == ["backend=simulated", "simulate.hardware=h100-80gb"]
    assert "engine.kv_budget=32MiB" in embedded and "workload=comparison" in embedded
    assert not any(arg.startswith("search.slo_scale.") for arg in embedded)
    llama = gpu.setup_overrides("llama3-8b")
    assert "model=dummy-llama3-8b" in llama and "engine.dtype=bf16" in llama
    assert not any(arg.startswith("engine.kv_budget=") for arg in llama)
    with pytest.raises(ValueError, match="no setup 'h200'"):
        gpu.setup_overrides("h200")


def test_a_true_knee_is_lengthened_until_two_draws_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draws 20% apart at 2,000 requests, 3% apart at 4,000: the truth is the second pair's
    geometric mean; draws that never agree stop at the most requests, their spread kept."""
    knees = {(2000, 0): 5.0, (2000, 1): 6.0, (4000, 0): 5.0, (4000, 1): 5.15}
    asked: list[int] = []

    def draw(cfg: object, requests: int, seed: int, work: Path) -> float:
        asked.append(requests)
        return knees.get((requests, seed), 4.0 + seed)

    monkeypatch.setattr(gpu, "true_knee_of_draw", draw)
    truth = gpu.true_knee(None, Path("."))  # type: ignore[arg-type]
    assert truth.requests == 4000 and truth.draws == (5.0, 5.15)
    assert truth.knee == pytest.approx((5.0 * 5.15) ** 0.5)
    knees.clear()
    apart = gpu.true_knee(None, Path("."))  # type: ignore[arg-type]
    assert apart.requests == gpu.MOST_TRUTH_REQUESTS and apart.draws == (4.0, 5.0)
