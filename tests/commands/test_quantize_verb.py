"""`servelab quantize` on a tiny checkpoint folder (with the real tokenizer, so the calibration
and evaluation text are real): the checkpoint and its records land in the cache, and a run
serving those weights carries their quality in its summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import save_file

from servelab.base.errors import ConfigError
from servelab.commands.quantize import main, quantize_main
from servelab.harness.measure.weights_quality import read_quality
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.models.hf_folder import hf_config_dict, hf_name
from tests.int4_cases import CONFIG, tiny_checkpoint

SMALL = [
    "strategy.group_size=32",
    "strategy.calibration_samples=4",
    "strategy.calibration_seq_len=64",
    "strategy.awq_grid=5",
    "workload.num_requests=3",
    "workload.output_len.value=6",
]


def tiny_folder(root: Path, tokenizer) -> Path:
    folder = root / "tiny-hf"
    folder.mkdir()
    _, state = tiny_checkpoint(seed=11, salient=3)
    save_file({hf_name(k): v.contiguous() for k, v in state.items()}, str(folder / "x.safetensors"))
    (folder / "config.json").write_text(json.dumps(hf_config_dict(CONFIG)))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.mark.integration
def test_quantize_records_quality_and_runs_report_it(tmp_path, tokenizer, capsys):
    folder = tiny_folder(tmp_path, tokenizer)
    cache = tmp_path / "cache"
    overrides = ["model=hf", f"model.path={folder}", f"engine.cache_dir={cache}", *SMALL]
    text = quantize_main(compose(overrides), "awq", windows=1)
    assert "int4-awq" in text and "dense" in text and "quality record:" in text
    (made,) = (cache / "quantized").iterdir()
    calibration = json.loads((made / "calibration.json").read_text())
    assert calibration["calibration"]["tokens"] == 4 * 64
    assert calibration["calibration"]["text"].startswith("pydoc_data.topics")
    (record_file,) = (p for p in (cache / "quality").iterdir() if "int4-awq" in p.name)
    record = json.loads(record_file.read_text())
    agreement = record["greedy_agreement"]
    assert agreement["requests"] == 3 and 0 <= agreement["identical_share"] <= 1
    assert 0 < agreement["next_token_share"] <= 1  # random tiny weights still agree somewhere
    perplexity = record["perplexity"]["fp32"]["value"]
    assert perplexity > 1 and record["dense_perplexity_fp32"] > 1

    cfg = compose([*overrides, "strategy.weights=int4-awq", "telemetry.roofline=false"])
    summary = run(cfg, tmp_path / "run", progress=False)
    weights = summary["weights"]
    assert weights["option"] == "int4-awq" and weights["perplexity_fp32"] == perplexity
    assert weights["greedy_agreement"] == agreement["identical_share"]
    assert weights["made"]["folder"] == str(made)  # served from the cache, not remade
    assert read_quality(cache, weights["weights_id"])["perplexity"]["fp32"]["value"] == perplexity


def test_quantize_needs_one_known_method():
    with pytest.raises(ConfigError, match="method"):
        main(["method=gptq"])
    with pytest.raises(ConfigError, match="method"):
        main(["windows=2"])
