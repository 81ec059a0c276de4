"""Trace replay: round trips through CSV and JSONL, public column names, scaling, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.build import build_workload
from servelab.workloads.traces import read_trace, write_trace

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"
CONTEXT = 8192
FIELD = "workload.trace.path"

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.0000000,879,20
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
118,GPT-4,417,217,634,Conversation log
"""


def preset(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.integration
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_round_trip_gives_identical_requests(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase, suffix: str
) -> None:
    original = build_workload(preset("poisson", "num_requests=24"), tokenizer, CONTEXT)
    path = tmp_path / f"trace{suffix}"
    write_trace(original, path)
    replayed = build_workload(
        preset("trace", f"trace.path={path}", "trace.max_requests=null"), tokenizer, CONTEXT
    )
    assert replayed.requests == original.requests
    assert replayed.hash == original.hash


def test_azure_columns_and_datetimes(tmp_path: Path) -> None:
    rows = read_trace(write(tmp_path, "azure.csv", AZURE), FIELD)
    assert rows.input_tokens == (374, 396, 879)
    assert rows.output_tokens == (44, 109, 20)
    assert rows.times[0] == 0.0
    assert rows.times[1] == pytest.approx(4.314579, abs=1e-9)
    assert rows.times[2] == pytest.approx(4.31941, abs=1e-9)


def test_datetimes_with_a_time_zone(tmp_path: Path) -> None:
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 23:59:59.5+00:00,10,5\n"
        "2024-05-11T00:00:01Z,20,6\n"
    )
    assert read_trace(write(tmp_path, "tz.csv", text), FIELD).times == (0.0, 1.5)


def test_burstgpt_columns_and_failed_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "burst.csv", BURSTGPT)
    with pytest.raises(ConfigError, match="line 3: 0 input or output tokens") as error:
        read_trace(path, FIELD)
    assert error.value.field == FIELD
    rows = read_trace(path, FIELD, drop_empty=True)
    assert rows.times == (0.0, 113.0)
    assert rows.input_tokens == (472, 417)
    assert rows.output_tokens == (18, 217)


def test_jsonl_trace(tmp_path: Path) -> None:
    text = '{"timestamp": 1.5, "input_tokens": 8, "output_tokens": 4}\n\n'
    text += '{"timestamp": 2.0, "input_tokens": 9, "output_tokens": 5}\n'
    rows = read_trace(write(tmp_path, "t.jsonl", text), FIELD)
    assert rows.times == (0.0, 0.5)
    assert rows.input_tokens == (8, 9)


@pytest.mark.integration
def test_replay_scaling_and_truncation(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    text = "timestamp,input_tokens,output_tokens\n" + "".join(
        f"{t},{10 + t},{5 + t}\n" for t in (0, 2, 4, 6, 8, 10)
    )
    path = write(tmp_path, "t.csv", text)

    def times(*overrides: str) -> list[float]:
        cfg = preset("trace", f"trace.path={path}", *overrides)
        return [r.arrival for r in build_workload(cfg, tokenizer, CONTEXT).requests]

    assert times() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert times("trace.time_scale=2") == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert times("trace.max_requests=2") == [0.0, 2.0]
    assert times("trace.max_seconds=5") == [0.0, 2.0, 4.0]
    assert times("trace.time_scale=2", "trace.max_seconds=2.5") == [0.0, 1.0, 2.0]
    cfg = preset("trace", f"trace.path={path}", "arrival.process=poisson", "arrival.rate=1")
    poisson = build_workload(cfg, tokenizer, CONTEXT)
    assert [r.arrival for r in poisson.requests] != times()
    assert [len(r.prompt_ids) for r in poisson.requests] == [10, 12, 14, 16, 18, 20]
    assert [r.max_tokens for r in poisson.requests] == [5, 7, 9, 11, 13, 15]


@pytest.mark.integration
def test_trace_lengths_and_random_fill(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    path = write(tmp_path, "azure.csv", AZURE)
    cfg = preset("trace", f"trace.path={path}", "prompt.fill=random", "length_scale=0.5")
    workload = build_workload(cfg, tokenizer, CONTEXT)
    assert [len(r.prompt_ids) for r in workload.requests] == [187, 198, 440]
    assert [r.max_tokens for r in workload.requests] == [22, 54, 10]
    assert all(r.prompt_text is None for r in workload.requests)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.csv", "", "has no rows"),
        ("header.csv", "timestamp,input_tokens,output_tokens\n", "has no rows"),
        ("unsorted.csv", "timestamp,input_tokens,output_tokens\n0,5,5\n3,5,5\n1,5,5\n", "line 4"),
        ("nocol.csv", "timestamp,input_tokens\n0,5\n", "no column 'output_tokens'"),
        ("bad.csv", "timestamp,input_tokens,output_tokens\nnoon,5,5\n", "give seconds"),
        ("neg.csv", "timestamp,input_tokens,output_tokens\n0,-5,5\n", "whole number"),
        ("t.txt", "timestamp,input_tokens,output_tokens\n0,5,5\n", "unknown suffix"),
        ("t.jsonl", "[1, 2]\n", "JSON object"),
    ],
)
def test_bad_trace_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        read_trace(write(tmp_path, name, text), FIELD)
    assert error.value.field == FIELD


@pytest.mark.integration
def test_missing_trace_file(tmp_path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    cfg = preset("trace", f"trace.path={tmp_path / 'absent.csv'}")
    with pytest.raises(ConfigError, match="does not exist") as error:
        build_workload(cfg, tokenizer, CONTEXT)
    assert error.value.field == FIELD


@pytest.mark.integration
def test_trace_request_longer_than_the_context(
    tmp_path: Path, tokenizer: PreTrainedTokenizerBase
) -> None:
    cfg = preset("trace", f"trace.path={write(tmp_path, 'azure.csv', AZURE)}")
    with pytest.raises(ConfigError, match="request 2 needs 879 prompt") as error:
        build_workload(cfg, tokenizer, 512)
    assert error.value.field == FIELD
