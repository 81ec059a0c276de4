"""Bad speculative settings stop before any work with one line naming the field."""

from __future__ import annotations

import pytest

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.draft import draft_model_of
from servelab.harness.run.settings import model_of
from servelab.strategies.settings import strategy_settings
from tests.tiny import make_engine, strategy, tiny_model


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"proposer": "oracle"}, "strategy.proposer"),
        ({"gamma": 0}, "strategy.gamma"),
        ({"gamma_rule": "sometimes"}, "strategy.gamma_rule"),
        ({"ngram_min": 4, "ngram_max": 2}, "strategy.ngram_min"),
        ({"proposer": "draft", "draft_weights": "int9"}, "strategy.draft_weights"),
    ],
)
def test_bad_speculative_keys_are_config_errors(overrides: dict, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        strategy("iteration", "paged", decoding="speculative", **overrides)
    assert error.value.field == field


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["strategy=vllm-spec-layerskip", "strategy.layerskip_layers=2"],
            "strategy.layerskip_layers: 2 is not fewer than the target's 2 layers",
        ),
        (
            ["strategy=vllm-spec-draft", "strategy.draft_model=dummy-llama2-7b"],
            "strategy.draft_model: dummy-llama2-7b has a vocabulary of 32000",
        ),
        (
            ["strategy=vllm-spec-draft", "strategy.draft_model=nosuch"],
            "strategy.draft_model: unknown model preset 'nosuch'; choose target or:",
        ),
    ],
)
def test_a_drafter_that_cannot_work_is_refused_before_loading(
    overrides: list[str], message: str
) -> None:
    cfg = compose(["model=dummy-tiny", *overrides])
    with pytest.raises(ConfigError) as error:
        draft_model_of(model_of(cfg), strategy_settings(cfg.strategy))
    assert str(error.value).startswith(message)


def test_an_engine_without_its_draft_model_says_so() -> None:
    settings = strategy("iteration", "paged", decoding="speculative", proposer="draft")
    with pytest.raises(ConfigError, match="no draft model was loaded"):
        make_engine(tiny_model(), settings, kv_slots=64)
