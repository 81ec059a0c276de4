"""Secrets in the environment never reach what servelab writes: a run's directory
(config.yaml, meta.json, records, report) and the server's record directory and output hold
the name of the variable that carries a key, never the key, whatever was asked of them."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path

import httpx
import pytest

from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from tests.server_process import start_server

KEY_ENV = "SERVELAB_TEST_SECRET_KEY"


def _files_hold(root: Path, secret: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_text(errors="replace")]


def test_a_run_directory_holds_no_secret_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-" + secrets.token_hex(16)
    for name in ("OPENAI_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", KEY_ENV):
        monkeypatch.setenv(name, secret)
    cfg = compose(
        [
            "model=dummy-tiny",
            "engine.dtype=fp32",
            "telemetry.roofline=false",
            "workload=smoke",
            "workload.num_requests=2",
            f"endpoint.api_key_env={KEY_ENV}",  # named, unused in process
        ]
    )
    run(cfg, tmp_path, progress=False)
    assert _files_hold(tmp_path, secret) == []
    assert KEY_ENV in (tmp_path / "config.yaml").read_text()


@pytest.mark.integration
def test_the_server_writes_and_prints_no_key(tmp_path: Path) -> None:
    key = "sk-" + secrets.token_hex(16)
    record = tmp_path / "served"
    overrides = [
        "model=dummy-tiny",
        "engine.dtype=fp32",
        "strategy=vllm",
        f"serve.api_key_env={KEY_ENV}",
        f"serve.record_dir={record}",
    ]
    server = start_server(overrides, env={KEY_ENV: key, "OMP_NUM_THREADS": "1"})
    body = {"model": "dummy-tiny", "prompt": [5, 6, 7], "max_tokens": 3}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        wrong = client.post(
            "/v1/completions", json=body, headers={"Authorization": f"Bearer {key[:-1]}x"}
        )
        assert wrong.status_code == 401 and key not in wrong.text
        right = client.post(
            "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        assert right.status_code == 200
    assert server.stop(signal.SIGINT) == 0
    assert _files_hold(record, key) == []
    assert (record / "requests.jsonl").read_text().count("\n") == 1
    assert key not in "".join(server.output)
