"""A prompt file the user brings: text through the chat template, raw text, ids, times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.build import build_workload
from servelab.workloads.spec import Workload

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"
CONTEXT = 8192
FIELD = "workload.path"


def preset(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name="jsonl", overrides=list(overrides))


def write(tmp_path: Path, lines: list[object]) -> Path:
    path = tmp_path / "prompts.jsonl"
    text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    path.write_text("".join(f"{line}\n" for line in text))
    return path


def build(tokenizer: PreTrainedTokenizerBase, path: Path, *overrides: str) -> Workload:
    return build_workload(preset(f"path={path}", *overrides), tokenizer, CONTEXT)


@pytest.mark.integration
def test_text_raw_text_and_ids(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write(
        tmp_path,
        [
            {"prompt": "What does the assert statement do?", "max_tokens": 12, "id": "q1"},
            {"prompt": "def add(a, b):", "raw": True},
            "",
            {"prompt_ids": [17, 18, 19, 20]},
        ],
    )
    workload = build(tokenizer, path)
    first, second, third = workload.requests
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What does the assert statement do?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert first.id == "q1" and list(first.prompt_ids) == list(chat) and first.max_tokens == 12
    assert first.prompt_text == "What does the assert statement do?"
    raw = tokenizer("def add(a, b):", add_special_tokens=False)["input_ids"]
    assert second.id == "1" and list(second.prompt_ids) == raw and second.max_tokens == 64
    assert third.id == "2" and third.prompt_ids == (17, 18, 19, 20) and third.prompt_text is None
    assert [r.arrival for r in workload.requests] == [0.0, 0.0, 0.0]
    assert not any(r.ignore_eos for r in workload.requests)


@pytest.mark.integration
def test_arrival_times_are_replayed(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write(
        tmp_path,
        [
            {"prompt_ids": [20, 21], "arrival": 0.5, "max_tokens": 3},
            {"prompt_ids": [22, 23], "arrival": 1.5, "max_tokens": 3},
            {"prompt_ids": [24, 25], "arrival": 4, "max_tokens": 3},
        ],
    )
    assert [r.arrival for r in build(tokenizer, path).requests] == [0.5, 1.5, 4.0]
    scaled = build(tokenizer, path, "trace.time_scale=2", "trace.max_seconds=1")
    assert [r.arrival for r in scaled.requests] == [0.25, 0.75]
    poisson = build(tokenizer, path, "arrival.process=poisson", "arrival.rate=10")
    assert [r.arrival for r in poisson.requests][0] == 0.0
    assert [r.arrival for r in poisson.requests] != [0.5, 1.5, 4.0]


@pytest.mark.integration
def test_same_file_same_hash(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write(tmp_path, [{"prompt": "Hello"}, {"prompt": "Bye"}])
    assert build(tokenizer, path).hash == build(tokenizer, path).hash
    assert build(tokenizer, path).hash != build(tokenizer, path, "output_len.value=65").hash


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], "line 1: not valid JSON"),
        ([[1, 2]], "line 1: each line must be a JSON object"),
        ([{"prompt": "a", "prompt_ids": [20]}], "exactly one of"),
        ([{"max_tokens": 3}], "exactly one of"),
        ([{"prompt": ""}], "non-empty text"),
        ([{"prompt": "a", "raw": "yes"}], "'raw' must be true or false"),
        ([{"prompt_ids": []}], "non-empty list"),
        ([{"prompt_ids": [49152]}], "ids must be integers in"),
        ([{"prompt": "a", "max_tokens": 0}], "'max_tokens' is 0"),
        ([{"prompt": "a", "arrival": -1}], "'arrival' is -1"),
        ([{"prompt": "a", "promt": "b"}], "unknown key 'promt'"),
        ([{"prompt": "a", "id": "x"}, {"prompt": "b", "id": "x"}], "'x' appears twice"),
        ([{"prompt": "a", "arrival": 1}, {"prompt": "b"}], "some lines have 'arrival'"),
        ([{"prompt": "a", "arrival": 2}, {"prompt": "b", "arrival": 1}], "request 2 arrives"),
        ([{"prompt": "a", "max_tokens": 9000}], "over the model context"),
        ([""], "has no requests"),
    ],
)
@pytest.mark.integration
def test_bad_lines_name_the_file(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, lines: list[object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        build(tokenizer, write(tmp_path, lines))
    assert error.value.field == FIELD


@pytest.mark.integration
def test_missing_or_absent_file(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ConfigError, match="workload.path=FILE") as error:
        build_workload(preset(), tokenizer, CONTEXT)
    assert error.value.field == FIELD
    with pytest.raises(ConfigError, match="does not exist"):
        build(tokenizer, tmp_path / "absent.jsonl")


@pytest.mark.integration
def test_lines_without_max_tokens_need_a_distribution(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    path = write(tmp_path, [{"prompt": "a"}])
    with pytest.raises(ConfigError) as error:
        build(tokenizer, path, "output_len=null")
    assert error.value.field == "workload.output_len"
