"""The seed strategies as other engines' switches (`harness/run/servers/strategy_flags.py`):
each preset's choices become the engine's flags, a choice it has no switch for is refused with
one line naming the engine, and docs/strategies.md shows the table the code makes."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose, strategy_preset, strategy_presets
from servelab.harness.run.servers.strategy_flags import table, translate
from servelab.harness.run.settings import engine_settings
from servelab.harness.run.spec import run_spec
from servelab.strategies.settings import StrategySettings, strategy_settings

DOCS = Path(__file__).resolve().parents[4] / "docs" / "strategies.md"
LIMITS = replace(engine_settings(compose([]).engine), max_batch_size=8, max_num_batched_tokens=512)


def preset(name: str) -> StrategySettings:
    return strategy_settings(strategy_preset(name))


def test_a_preset_read_from_its_file_is_the_one_the_run_composes() -> None:
    for name, node in strategy_presets().items():
        composed = compose([f"strategy={name}"]).strategy
        assert OmegaConf.to_container(node) == OmegaConf.to_container(composed), name
    with pytest.raises(ConfigError, match=r"^strategy: unknown preset 'nope'"):
        strategy_preset("nope")


def test_each_axis_becomes_the_engine_s_switch() -> None:
    chunked = translate("vllm", preset("orca-chunked"), LIMITS)
    assert chunked.flags == (
        "--max-num-seqs",
        "8",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens",
        "512",
        "--no-enable-prefix-caching",
    )
    assert chunked.notes and "paged" in chunked.notes[0]  # vLLM has no contiguous KV
    paged = translate("vllm", preset("vllm"), LIMITS)
    assert "--enable-prefix-caching" in paged.flags and "--block-size" not in paged.flags
    assert paged.notes == (
        "its KV block size is its own unless server.same_budget sizes its KV (vLLM on a CPU "
        "takes multiples of 32 only)",
    )
    ngram = translate("vllm", preset("vllm-spec-ngram"), LIMITS)
    assert ngram.flags[-2:] == (
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":3}',
    )
    plain = translate("sglang", preset("vllm-noprefix"), LIMITS)
    assert "--disable-radix-cache" in plain.flags and "-1" in plain.flags
    static = translate("llamacpp", preset("fastertransformer"), LIMITS)
    assert static.flags == ("--parallel", "8", "--no-cont-batching")
    reuse = translate("llamacpp", preset("vllm"), LIMITS)
    assert reuse.flags[-2:] == ("--cache-reuse", "16")


def test_a_choice_an_engine_has_no_switch_for_is_refused_naming_the_engine() -> None:
    refusals = {
        ("vllm", "fastertransformer"): "no static batching",
        ("sglang", "vllm-spec-ngram"): "draft model",
        ("llamacpp", "orca-chunked"): "no chunked-prefill switch",
        ("llamacpp", "vllm-awq"): "GGUF",
        ("vllm", "vllm-spec-layerskip"): "prompt lookup",
    }
    for (engine, name), reason in refusals.items():
        with pytest.raises(
            ConfigError, match=rf"^server\.strategy: {engine} cannot serve {name}: .*{reason}"
        ):
            translate(engine, preset(name), LIMITS)
    mha = OmegaConf.merge(strategy_preset("vllm"), {"heads": "mha"})
    with pytest.raises(ConfigError, match="vllm cannot serve vllm: .*heads=mha"):
        translate("vllm", strategy_settings(mha), LIMITS)


def test_a_server_started_for_a_preset_gets_its_switches_before_its_own_flags() -> None:
    spec = run_spec(
        compose(
            [
                "server=vllm",
                "server.strategy=orca",
                f"server.executable={sys.executable}",
                "server.model=/models/x",
                "engine.max_batch_size=4",
                "server.flags=[--max-num-seqs,2]",
                "server.same_budget=false",  # its KV switches: test_kv_flags.py
            ]
        )
    )
    assert spec.server is not None and spec.server.label == "vllm:orca --max-num-seqs 2"
    argv = spec.server.argv(1234)
    assert argv[-6:] == [
        "--max-num-seqs",
        "4",
        "--no-enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--max-num-seqs",
        "2",
    ]
    with pytest.raises(ConfigError, match="vllm cannot serve fastertransformer"):
        run_spec(
            compose(
                [
                    "server=vllm",
                    "server.strategy=fastertransformer",
                    f"server.executable={sys.executable}",
                    "server.model=/m",
                ]
            )
        )
    with pytest.raises(ConfigError, match=r"^server\.strategy: server=command runs"):
        run_spec(compose(["server=command", "server.strategy=orca", "server.command=[x,'{port}']"]))


def test_the_docs_show_the_table_the_code_makes() -> None:
    presets = {name: strategy_settings(node) for name, node in strategy_presets().items()}
    made = table(presets, engine_settings(compose([]).engine))
    assert made in DOCS.read_text(), "run python -m servelab.harness.run.servers.strategy_flags"
