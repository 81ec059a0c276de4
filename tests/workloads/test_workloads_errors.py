"""Bad workload configs stop with one ConfigError naming the field, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.build import build_workload

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"


@pytest.mark.parametrize(
    ("name", "overrides", "field"),
    [
        ("poisson", ["arrival.rate=0"], "workload.arrival.rate"),
        ("poisson", ["arrival.rate=-1.5"], "workload.arrival.rate"),
        ("poisson", ["arrival.burstiness=0"], "workload.arrival.burstiness"),
        ("smoke", ["arrival.process=closed_loop"], "workload.arrival.concurrency"),
        ("smoke", ["arrival.process=bursty"], "workload.arrival.process"),
        ("smoke", ["arrival.process=trace"], "workload.arrival.process"),
        ("smoke", ["+arrival.rte=2"], "workload.arrival.rte"),
        ("smoke", ["+colour=red"], "workload.colour"),
        ("smoke", ["input_len.lo=50"], "workload.input_len.lo"),
        ("smoke", ["input_len.dist=zipf"], "workload.input_len.dist"),
        ("sharegpt_like", ["input_len.std=-1"], "workload.input_len.std"),
        ("sharegpt_like", ["output_len.std=-1"], "workload.output_len.std"),
        ("smoke", ["output_len.value=0"], "workload.output_len.value"),
        ("smoke", ["output_len.value=-3"], "workload.output_len.value"),
        ("smoke", ["num_requests=0"], "workload.num_requests"),
        ("smoke", ["num_requests=null"], "workload.num_requests"),
        ("smoke", ["seed=-1"], "workload.seed"),
        ("smoke", ["ignore_eos=maybe"], "workload.ignore_eos"),
        ("smoke", ["length_scale=0"], "workload.length_scale"),
        ("smoke", ["sampling.top_p=0"], "workload.sampling.top_p"),
        ("smoke", ["sampling.top_p=1.5"], "workload.sampling.top_p"),
        ("smoke", ["sampling.temperature=-1"], "workload.sampling.temperature"),
        ("smoke", ["sampling.top_k=-1"], "workload.sampling.top_k"),
        ("smoke", ["prompt.source=web"], "workload.prompt.source"),
        ("smoke", ["prompt.source=shared_prefix"], "workload.prompt.groups"),
        ("smoke", ["prompt.source=instruct", "prompt.tasks=[poem]"], "workload.prompt.tasks"),
        ("smoke", ["warmup.seconds=2"], "workload.warmup.seconds"),
        ("smoke", ["cooldown.seconds=2"], "workload.cooldown.seconds"),
        ("smoke", ["warmup.requests=-1"], "workload.warmup.requests"),
        ("poisson", ["warmup.requests=2", "warmup.seconds=2"], "workload.warmup"),
        ("smoke", ["warmup.requests=5", "cooldown.requests=3"], "workload.warmup"),
        ("trace", [], "workload.trace.path"),
        ("trace", ["trace.path=t.csv", "num_requests=5"], "workload.num_requests"),
        ("trace", ["trace.path=t.csv", "trace.time_scale=0"], "workload.trace.time_scale"),
        ("trace", ["trace.path=t.csv", "trace.max_requests=0"], "workload.trace.max_requests"),
        ("trace", ["trace.path=t.csv", "trace.max_seconds=0"], "workload.trace.max_seconds"),
        ("jsonl", [], "workload.path"),
        ("smoke", ["path=prompts.jsonl"], "workload.path"),
        ("smoke", ["trace.path=t.csv"], "workload.trace.path"),
    ],
)
@pytest.mark.integration
def test_bad_config_names_the_field(
    tokenizer: PreTrainedTokenizerBase, name: str, overrides: list[str], field: str
) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name=name, overrides=overrides)
    with pytest.raises(ConfigError) as error:
        build_workload(cfg, tokenizer, 8192)
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")
    assert "\n" not in str(error.value)


@pytest.mark.integration
@pytest.mark.parametrize("max_context", [0, 1, -5])
def test_bad_context_length(tokenizer: PreTrainedTokenizerBase, max_context: int) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name="smoke")
    with pytest.raises(ConfigError) as error:
        build_workload(cfg, tokenizer, max_context)
    assert error.value.field == "max_context"
