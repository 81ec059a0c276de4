"""Building workloads from the shipped presets: contents, determinism, prompt sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from servelab.base.errors import ConfigError
from servelab.workloads.build import build_workload
from servelab.workloads.corpus import special_ids
from servelab.workloads.instruct import INSTRUCTIONS
from servelab.workloads.lengths import parse_length_spec, sample_lengths
from servelab.workloads.seeds import Stream, stream
from servelab.workloads.spec import Workload

CONF = Path(__file__).resolve().parents[2] / "conf" / "workload"
CONTEXT = 8192


def preset(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def build(tokenizer: PreTrainedTokenizerBase, name: str, *overrides: str) -> Workload:
    return build_workload(preset(name, *overrides), tokenizer, CONTEXT)


def test_every_preset_is_named_after_its_file() -> None:
    for path in sorted(CONF.glob("*.yaml")):
        assert preset(path.stem).name == path.stem


@pytest.mark.parametrize(
    "name", ["offline", "poisson", "sharegpt_like", "alpaca_like", "random", "shared_prefix"]
)
@pytest.mark.integration
def test_generated_presets_build(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    cfg = preset(name)
    workload = build_workload(cfg, tokenizer, CONTEXT)
    arrivals = [r.arrival for r in workload.requests]
    assert workload.name == name
    assert len(workload.requests) == cfg.num_requests
    assert arrivals == sorted(arrivals)
    assert len({r.id for r in workload.requests}) == len(workload.requests)
    assert len(workload.hash) == 64 and int(workload.hash, 16) >= 0
    assert all(r.ignore_eos for r in workload.requests)


@pytest.mark.integration
def test_smoke_preset(tokenizer: PreTrainedTokenizerBase) -> None:
    workload = build(tokenizer, "smoke")
    assert [r.id for r in workload.requests] == [str(i) for i in range(8)]
    for request in workload.requests:
        assert 16 <= len(request.prompt_ids) <= 48
        assert request.max_tokens == 16
        assert request.arrival == 0.0 and not request.excluded
        assert request.ignore_eos and request.temperature == 0.0
        assert request.prompt_text == tokenizer.decode(list(request.prompt_ids))
    assert workload.concurrency is None


@pytest.mark.integration
def test_offline_preset_is_the_yardstick(tokenizer: PreTrainedTokenizerBase) -> None:
    workload = build(tokenizer, "offline")
    lengths = [len(r.prompt_ids) for r in workload.requests]
    assert len(lengths) == 64 and min(lengths) >= 32 and max(lengths) <= 256
    assert {r.max_tokens for r in workload.requests} == {64}
    assert {r.arrival for r in workload.requests} == {0.0}


@pytest.mark.integration
def test_same_config_same_workload_other_seed_other_hash(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    first = build(tokenizer, "poisson", "num_requests=16")
    again = build(tokenizer, "poisson", "num_requests=16")
    other = build(tokenizer, "poisson", "num_requests=16", "seed=1")
    assert first == again
    assert other.hash != first.hash
    assert [r.prompt_ids for r in other.requests] != [r.prompt_ids for r in first.requests]


@pytest.mark.integration
def test_changing_the_rate_changes_only_the_times(tokenizer: PreTrainedTokenizerBase) -> None:
    slow = build(tokenizer, "poisson", "num_requests=16", "arrival.rate=2")
    fast = build(tokenizer, "poisson", "num_requests=16", "arrival.rate=4")
    assert [r.prompt_ids for r in slow.requests] == [r.prompt_ids for r in fast.requests]
    assert [r.max_tokens for r in slow.requests] == [r.max_tokens for r in fast.requests]
    slow_times = np.array([r.arrival for r in slow.requests])
    assert np.allclose([r.arrival for r in fast.requests], slow_times / 2)
    assert slow.hash != fast.hash


@pytest.mark.integration
def test_text_prompts_never_share_a_start(tokenizer: PreTrainedTokenizerBase) -> None:
    workload = build(tokenizer, "offline")
    heads = {r.prompt_ids[:16] for r in workload.requests}
    assert len(heads) == len(workload.requests)


@pytest.mark.integration
def test_random_prompts_avoid_special_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    workload = build(tokenizer, "random")
    ids = np.concatenate([r.prompt_ids for r in workload.requests])
    special = special_ids(tokenizer)
    assert set(range(17)) <= special
    assert ids.min() >= 17 and ids.max() < len(tokenizer)
    assert not special & set(ids.tolist())
    lengths = [len(r.prompt_ids) for r in workload.requests]
    assert min(lengths) >= 64 and max(lengths) <= 192
    assert all(r.prompt_text is None for r in workload.requests)


@pytest.mark.integration
def test_shared_prefix_groups(tokenizer: PreTrainedTokenizerBase) -> None:
    workload = build(tokenizer, "shared_prefix")
    prefixes: dict[int, tuple[int, ...]] = {}
    for request in workload.requests:
        group = int(request.id) % 4
        prefix = request.prompt_ids[:256]
        assert prefixes.setdefault(group, prefix) == prefix
        assert 256 + 16 <= len(request.prompt_ids) <= 256 + 64
    assert len(set(prefixes.values())) == 4
    suffixes = {r.prompt_ids[256:272] for r in workload.requests}
    assert len(suffixes) == len(workload.requests)


@pytest.mark.integration
def test_instruct_prompts_have_the_drawn_length(tokenizer: PreTrainedTokenizerBase) -> None:
    cfg = preset("instruct", "num_requests=12")
    workload = build_workload(cfg, tokenizer, CONTEXT)
    spec = parse_length_spec(cfg.input_len, "workload.input_len")
    drawn = sample_lengths(spec, 12, stream(cfg.seed, Stream.INPUT_LEN))
    by_id = {r.id: r for r in workload.requests}
    tail = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    tasks = set()
    for index, length in enumerate(drawn.tolist()):
        request = by_id[str(index)]
        assert len(request.prompt_ids) == length
        assert request.prompt_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
        assert list(request.prompt_ids[-len(tail) :]) == tail
        assert request.prompt_text is not None
        tasks |= {task for task, text in INSTRUCTIONS.items() if text in request.prompt_text}
    assert tasks == set(INSTRUCTIONS)
    assert not any(r.ignore_eos for r in workload.requests)


@pytest.mark.integration
def test_instruct_prompts_too_short_for_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ConfigError, match="instruct prompts need at least") as error:
        build(tokenizer, "instruct", "input_len.lo=8", "input_len.hi=20")
    assert error.value.field == "workload.input_len"


@pytest.mark.integration
def test_closed_loop_carries_concurrency(tokenizer: PreTrainedTokenizerBase) -> None:
    two = build(tokenizer, "random", "arrival.process=closed_loop", "arrival.concurrency=2")
    three = build(tokenizer, "random", "arrival.process=closed_loop", "arrival.concurrency=3")
    assert two.concurrency == 2 and three.concurrency == 3
    assert {r.arrival for r in two.requests} == {0.0}
    assert two.requests == three.requests and two.hash != three.hash


@pytest.mark.integration
def test_sampling_settings_and_per_request_seeds(tokenizer: PreTrainedTokenizerBase) -> None:
    overrides = ("sampling.temperature=0.7", "sampling.top_k=20", "sampling.top_p=0.9")
    workload = build(tokenizer, "random", *overrides)
    again = build(tokenizer, "random", *overrides)
    assert {(r.temperature, r.top_k, r.top_p) for r in workload.requests} == {(0.7, 20, 0.9)}
    seeds = [r.seed for r in workload.requests]
    assert len(set(seeds)) == len(seeds) and all(isinstance(s, int) for s in seeds)
    assert seeds == [r.seed for r in again.requests]


@pytest.mark.integration
def test_length_scale_shrinks_sharegpt(tokenizer: PreTrainedTokenizerBase) -> None:
    full = build(tokenizer, "sharegpt_like", "prompt.source=random")
    quarter = build(tokenizer, "sharegpt_like", "prompt.source=random", "length_scale=0.25")
    for big, small in zip(full.requests, quarter.requests, strict=True):
        assert len(small.prompt_ids) == max(1, round(len(big.prompt_ids) * 0.25))
        assert small.max_tokens == max(1, round(big.max_tokens * 0.25))


@pytest.mark.integration
def test_request_longer_than_the_context(tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ConfigError, match="over the model context of 40") as error:
        build_workload(preset("smoke"), tokenizer, 40)
    assert error.value.field == "workload.input_len"
