"""A checkpoint folder whose config.json is broken is refused with one line naming
`model.path` and what is wrong, never a traceback (found while trying bad inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.models.hf_folder import read_hf_config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"model_type": "llama"}', "lacks 'num_attention_heads'; is it a Llama checkpoint?"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        (
            '{"num_attention_heads": 0, "vocab_size": 8, "hidden_size": 8,'
            ' "intermediate_size": 8, "num_hidden_layers": 1}',
            "has a malformed value",
        ),
    ],
)
def test_a_broken_config_json_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ConfigError, match="model.path") as refused:
        read_hf_config(tmp_path)
    assert message in str(refused.value) and "\n" not in str(refused.value)
