"""The run spec: the composed config read once into typed parts, each part what its backend
reads, every field checked before anything loads, and the run following the spec alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run_spec_into
from servelab.harness.run.spec import run_record, run_spec
from servelab.models.spec import model_spec

TINY = [
    "model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false", "workload=random",
    "workload.num_requests=3", "workload.output_len.value=4", "workload.arrival.process=offline",
]  # fmt: skip


def test_each_backend_gets_the_parts_it_reads() -> None:
    spec = run_spec(compose([*TINY, "strategy=vllm", "slo.tpot_s=0.5"]))
    assert spec.backend == "inprocess" and spec.endpoint is None and spec.simulate is None
    assert spec.engine is not None and spec.engine.strategy.name == "vllm"
    assert spec.engine.model == spec.model and spec.model.shape == "tiny"
    assert spec.slo.tpot_s == 0.5 and spec.workload.num_requests == 3
    assert spec.seeds == {"engine": 0, "workload": 0}
    peer = run_spec(compose([*TINY, "backend=openai", "endpoint.url=http://127.0.0.1:9"]))
    assert peer.engine is None and peer.endpoint is not None
    assert peer.endpoint.url == "http://127.0.0.1:9"
    simulated = run_spec(compose([*TINY, "backend=simulated", "simulate.hardware=a100-80gb"]))
    assert simulated.simulate is not None and simulated.simulate.hardware == "a100-80gb"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["backend=openai", "replay.skip_idle=true"], r"^replay\.skip_idle: in-process runs"),
        (["backend=hf_static", "slo.stop_early=0.9"], r"^slo\.stop_early: not with backend"),
        (["backend=simulated"], r"^simulate: backend=simulated needs one of"),
        (["model=hf", "model.path=/no/such/folder"], r"^model\.path: /no/such/folder does not"),
        (["model=dummy-tiny", "model.shape=nosuch"], r"^model\.shape: unknown dummy shape"),
        (["backend=openai", "endpoint.url=localhost"], r"^endpoint\.url: 'localhost' must be"),
    ],
)
def test_a_bad_field_is_refused_by_the_parse(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        run_spec(compose([*TINY, *overrides]))


def test_the_run_follows_the_spec_not_the_config_it_came_from(tmp_path: Path) -> None:
    cfg = compose([*TINY, "strategy=vllm"])
    spec = run_spec(cfg)
    with open_dict(cfg):
        cfg.workload.num_requests = 5
        cfg.slo.tpot_s = 1e-9
        cfg.model.shape = "nosuch"
        cfg.strategy.kv = "nosuch"
        cfg.backend = "nosuch"
    summary = run_spec_into(spec, tmp_path, progress=False)
    assert summary["status"] == "complete" and summary["completed"] == 3
    assert summary["slo_attainment"] == 1.0  # no limit when parsed; 1e-9 s would fail all
    recorded = (tmp_path / "config.yaml").read_text()
    assert "nosuch" not in recorded and "num_requests: 3" in recorded
    assert json.loads((tmp_path / "meta.json").read_text())["config"]["backend"] == "inprocess"


def test_a_recorded_config_is_read_on_any_machine() -> None:
    cfg = compose([*TINY, "engine.device=cuda:3", "model=hf", "model.path=/elsewhere"])
    record = run_record(cfg)  # no device resolved, no model file looked for
    assert record.model_name == "hf" and record.backend == "inprocess"
    if torch.cuda.is_available():
        return  # the run itself needs the device only where there is none
    with pytest.raises(ConfigError, match=r"^engine\.device: cuda:3 asked for but no CUDA"):
        run_spec(compose([*TINY, "engine.device=cuda:3"]))


def test_a_tokenizer_folder_is_checked_with_the_model(tmp_path: Path) -> None:
    node = {"name": "dummy-tiny", "source": "dummy", "shape": "tiny", "tokenizer": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"^model\.tokenizer: .* holds no tokenizer\.json"):
        model_spec(node, tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_spec(node, tmp_path).tokenizer == tmp_path
