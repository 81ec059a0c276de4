"""Try every kind of bad input on the tiny model and print what the user saw, one table row each.

Config values, workload and trace files and checkpoints go to the `servelab` command line as
a user would give them (its entry point, in this process so that torch loads once: the exit
status and the last line it printed to stderr, or the exception that escaped); HTTP requests
go to a `servelab serve` on the tiny model in a subprocess (the status and the error body).
The table is Markdown, for notes: `python scripts/bad_inputs.py > table.md`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model=dummy-tiny", "engine.dtype=fp32", "telemetry.roofline=false"]
MODEL = "dummy-tiny"


def servelab(args: list[str]) -> str:
    """Run `servelab ARGS` through its entry point: `exit N: the last line on stderr`."""
    from servelab.commands.cli import main as servelab_main

    os.environ.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    captured = io.StringIO()
    sys.argv = ["servelab", *args]
    code: object = 0
    try:
        with contextlib.redirect_stderr(captured):
            servelab_main()
    except SystemExit as exit_info:
        code = exit_info.code
    except Exception as escaped:  # noqa: BLE001  (what the user would see as a traceback)
        return f"traceback: {type(escaped).__name__}: {escaped}".splitlines()[0]
    lines = [line for line in captured.getvalue().splitlines() if line.strip()]
    return f"exit {code or 0}: {lines[-1].strip() if lines else '(nothing on stderr)'}"


def files(root: Path) -> dict[str, Path]:
    """Bad workload, trace and checkpoint files."""
    from servelab.models.dummy import DUMMY_SHAPES
    from servelab.models.hf_folder import hf_config_dict

    made = {}

    def write(name: str, text: str | bytes) -> Path:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        made[name] = path
        return path

    write("not_json.jsonl", '{"prompt_ids": [5, 6, 7]}\n{this is not json\n')
    write("bad_token.jsonl", '{"prompt_ids": [5, 6, 1000000000]}\n')
    write("negative_max.jsonl", '{"prompt_ids": [5, 6, 7], "max_tokens": -5}\n')
    write("too_long.jsonl", json.dumps({"prompt_ids": [5] * 600}) + "\n")
    write("empty.jsonl", "")
    write("trace_columns.csv", "when,foo\n0,1\n")
    write("trace_backwards.csv", "timestamp,input_tokens,output_tokens\n5,10,4\n1,10,4\n")
    write("trace_negative.csv", "timestamp,input_tokens,output_tokens\n0,-3,4\n")
    write("garbage.gguf", b"GGUF" + os.urandom(256))
    write("random.gguf", os.urandom(512))
    pickled = root / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text(json.dumps(hf_config_dict(DUMMY_SHAPES["tiny"])))
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle.")
    made["pickled"] = pickled
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    made["broken"] = broken
    return made


def command_line_rows(root: Path) -> list[tuple[str, str, str]]:
    bad = files(root)
    run_dir = f"hydra.run.dir={root / 'run'}"
    rows: list[tuple[str, str, list[str]]] = [
        ("config", "engine.kv_budget=lots", [*TINY, "engine.kv_budget=lots"]),
        ("config", "engine.kv_budget=1KiB (below one request)", [*TINY, "engine.kv_budget=1KiB"]),
        ("config", "engine.max_batch_size=0", [*TINY, "engine.max_batch_size=0"]),
        ("config", "engine.dtype=fp8", [*TINY, "engine.dtype=fp8"]),
        ("config", "engine.device=cuda (no GPU)", [*TINY, "engine.device=cuda"]),
        ("config", "strategy.batching=greedy", [*TINY, "strategy.batching=greedy"]),
        ("config", "strategy=nope", [*TINY, "strategy=nope"]),
        ("config", "model=nosuch", ["model=nosuch"]),
        ("config", "strategy.block_size=0", [*TINY, "strategy=vllm", "strategy.block_size=0"]),
        (
            "config",
            "strategy=vllm-spec-ngram strategy.gamma=0",
            [*TINY, "strategy=vllm-spec-ngram", "strategy.gamma=0"],
        ),
        ("config", "workload.output_len.value=0", [*TINY, "workload.output_len.value=0"]),
        ("config", "workload.num_requests=-1", [*TINY, "workload.num_requests=-1"]),
        ("config", "slo.ttft_s=-1", [*TINY, "slo.ttft_s=-1"]),
        ("config", "telemetry.period_s=0", [*TINY, "telemetry.period_s=0", run_dir]),
        ("config", "engine.kv_budget=0.5 (a fraction, no GPU)", [*TINY, "engine.kv_budget=0.5"]),
        ("config", "serve.port=99999", ["serve", *TINY, "serve.port=99999"]),
        ("config", "serve.max_body=huge", ["serve", *TINY, "serve.max_body=huge"]),
        ("config", "serve.max_body=0.9", ["serve", *TINY, "serve.max_body=0.9"]),
        (
            "config",
            "serve.max_concurrent_requests=0",
            ["serve", *TINY, "serve.max_concurrent_requests=0"],
        ),
        (
            "config",
            "serve.api_key_env=UNSET_VARIABLE",
            ["serve", *TINY, "serve.api_key_env=UNSET_VARIABLE"],
        ),
        (
            "config",
            "backend=openai endpoint.url=http://127.0.0.1:9 (nothing listening)",
            [*TINY, "backend=openai", "endpoint.url=http://127.0.0.1:9"],
        ),
        (
            "workload",
            "workload=jsonl, no such file",
            ["workload=jsonl", "workload.path=/nope.jsonl"],
        ),
        ("workload", "jsonl with a line that is not JSON", ["workload=jsonl", "workload.path=X"]),
        ("workload", "jsonl with token id 10^9", ["workload=jsonl", "workload.path=X"]),
        ("workload", "jsonl with max_tokens -5", ["workload=jsonl", "workload.path=X"]),
        (
            "workload",
            "jsonl prompt of 600 tokens (context 512)",
            ["workload=jsonl", "workload.path=X"],
        ),
        ("workload", "empty jsonl file", ["workload=jsonl", "workload.path=X"]),
        ("trace", "trace with no time/length columns", ["workload=trace", "workload.trace.path=X"]),
        ("trace", "trace whose times go backwards", ["workload=trace", "workload.trace.path=X"]),
        ("trace", "trace with negative input tokens", ["workload=trace", "workload.trace.path=X"]),
        ("trace", "workload=trace, no path", ["workload=trace"]),
        ("checkpoint", "model=gguf, no such file", ["model=gguf", "model.path=/nope.gguf"]),
        ("checkpoint", "GGUF magic then garbage", ["model=gguf", "model.path=X"]),
        ("checkpoint", "random bytes named .gguf", ["model=gguf", "model.path=X"]),
        ("checkpoint", "model=hf, no such folder", ["model=hf", "model.path=/nope"]),
        ("checkpoint", "hf folder: pytorch_model.bin only", ["model=hf", "model.path=X"]),
        ("checkpoint", "hf folder: config.json not JSON", ["model=hf", "model.path=X"]),
        ("run dir", "servelab summarize on an empty folder", ["summarize", str(root)]),
        ("run dir", "servelab report on a missing folder", ["report", "/nope/run"]),
    ]
    sources = iter(
        [
            bad["not_json.jsonl"],
            bad["bad_token.jsonl"],
            bad["negative_max.jsonl"],
            bad["too_long.jsonl"],
            bad["empty.jsonl"],
            bad["trace_columns.csv"],
            bad["trace_backwards.csv"],
            bad["trace_negative.csv"],
            bad["garbage.gguf"],
            bad["random.gguf"],
            bad["pickled"],
            bad["broken"],
        ]
    )
    out = []
    for kind, what, args in rows:
        if any(a.endswith("=X") for a in args):
            source = next(sources)
            args = [a.replace("=X", f"={source}") for a in args]
        if kind in ("workload", "trace"):
            args = [*TINY, *args, run_dir]
        if kind == "checkpoint":
            args = [*args, "engine.dtype=fp32", "telemetry.roofline=false", run_dir]
        out.append((kind, what, servelab(args)))
        print(f"  tried {what}", file=sys.stderr, flush=True)
    return out


def http_rows() -> list[tuple[str, str, str]]:
    key = "sk-bad-inputs"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "BAD_INPUTS_KEY": key,
    }
    overrides = [
        *TINY,
        "strategy=vllm",
        "serve.port=0",
        "serve.api_key_env=BAD_INPUTS_KEY",
        "serve.max_concurrent_requests=1",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "servelab", "serve", *overrides],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    url = ""
    for line in process.stdout:
        if line.startswith("servelab: serving "):
            url = line.rsplit(" at ", 1)[1].strip()
            break
    threading.Thread(target=process.stdout.read, daemon=True).start()
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    valid = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4}
    requests: list[tuple[str, dict | bytes, dict[str, str]]] = [
        ("body that is not JSON", b"{nope", headers),
        ("body of 2 MiB (limit 1 MiB)", {**valid, "prompt": "x" * (2 << 20)}, headers),
        ("prompt of 600 tokens (context 512)", {**valid, "prompt": [5] * 600}, headers),
        ("prompt + max_tokens past the context", {**valid, "max_tokens": 510}, headers),
        ("max_tokens 0", {**valid, "max_tokens": 0}, headers),
        ('max_tokens "many"', {**valid, "max_tokens": "many"}, headers),
        ("temperature 5", {**valid, "temperature": 5}, headers),
        ("token id 10^9", {**valid, "prompt": [5, 1_000_000_000]}, headers),
        ("empty prompt", {**valid, "prompt": ""}, headers),
        ("n=2", {**valid, "n": 2}, headers),
        ("stop strings", {**valid, "stop": ["\n"]}, headers),
        ("logprobs", {**valid, "logprobs": 2}, headers),
        ("unknown model", {**valid, "model": "gpt-9"}, headers),
        ("no API key", valid, {"content-type": "application/json"}),
        ("wrong API key", valid, {**headers, "Authorization": "Bearer sk-wrong"}),
    ]
    rows = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for what, body, sent in requests:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = client.post("/v1/completions", content=content, headers=sent)
            rows.append(("HTTP", what, _said(response)))
        chat = {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}
        response = client.post("/v1/chat/completions", json=chat, headers=headers)
        rows.append(("HTTP", "chat message with role robot", _said(response)))
        long = {**valid, "max_tokens": 500, "ignore_eos": True}
        first = threading.Thread(
            target=client.post, args=("/v1/completions",), kwargs={"json": long, "headers": headers}
        )
        first.start()
        while True:
            metrics = client.get("/metrics").text
            if "servelab_requests_running 1.0" in metrics:
                break
        response = client.post("/v1/completions", json=valid, headers=headers)
        rows.append(("HTTP", "a 2nd request at max_concurrent_requests=1", _said(response)))
        first.join()
    process.send_signal(signal.SIGINT)
    process.wait(60)
    return rows


def _said(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        detail = (
            f"{error['type']}, param {error['param']}, code {error['code']}: {error['message']}"
        )
    except (ValueError, KeyError, TypeError):
        detail = response.text[:200]
    return f"HTTP {response.status_code} {detail}"


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        rows = command_line_rows(Path(scratch)) + http_rows()
    print("| kind | bad input | what the user saw |")
    print("|---|---|---|")
    for kind, what, said in rows:
        print(f"| {kind} | {what} | {said.replace('|', '/')} |")


if __name__ == "__main__":
    main()
