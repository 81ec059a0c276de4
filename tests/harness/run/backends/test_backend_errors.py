"""Bad backend and server settings stop before any work with one line naming the field: an
unknown backend, an endpoint that is no URL or cannot be reached, a missing API key variable,
a port out of range or taken. None of these loads a model or a tokenizer."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from servelab.commands.cli import main


def _fail(monkeypatch, capsys, tmp_path: Path, *args: str) -> str:
    argv = ["servelab", *args, f"hydra.run.dir={tmp_path / 'run'}", "telemetry.roofline=false"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.delenv("SERVELAB_NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("servelab: error: "), lines
    assert not (tmp_path / "run" / "requests.jsonl").exists()
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unknown_backend(monkeypatch, capsys, tmp_path) -> None:
    line = _fail(monkeypatch, capsys, tmp_path, "backend=tgi")
    assert "backend: 'tgi' is not one of: inprocess, openai, hf_static, hf_continuous" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("endpoint.url=localhost:8000",), "endpoint.url: 'localhost:8000' must be an http"),
        (("endpoint.timeout_s=0",), "endpoint.timeout_s: 0 must be seconds > 0"),
        (("endpoint.max_connections=0",), "endpoint.max_connections: 0 must be a positive"),
        (
            ("endpoint.api_key_env=SERVELAB_NO_SUCH_KEY",),
            "endpoint.api_key_env: environment variable SERVELAB_NO_SUCH_KEY is not set",
        ),
    ],
)
def test_bad_endpoint_settings(monkeypatch, capsys, tmp_path, args, expected) -> None:
    assert expected in _fail(monkeypatch, capsys, tmp_path, "backend=openai", *args)


def test_unreachable_endpoint(monkeypatch, capsys, tmp_path, closed_port) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    line = _fail(monkeypatch, capsys, tmp_path, "backend=openai", f"endpoint.url={url}")
    assert f"endpoint.url: cannot reach {url}" in line and "start the server" in line


def test_bad_serve_settings(monkeypatch, capsys, tmp_path) -> None:
    line = _fail(monkeypatch, capsys, tmp_path, "serve", "serve.port=70000")
    assert "serve.port: 70000 must be a port number" in line
    line = _fail(monkeypatch, capsys, tmp_path, "serve", "serve.api_key_env=SERVELAB_NO_SUCH_KEY")
    assert "serve.api_key_env: environment variable SERVELAB_NO_SUCH_KEY is not set" in line


def test_serve_on_a_taken_port(monkeypatch, capsys, tmp_path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _fail(monkeypatch, capsys, tmp_path, "serve", f"serve.port={port}")
    assert f"serve.port: cannot listen on 127.0.0.1:{port}" in line
