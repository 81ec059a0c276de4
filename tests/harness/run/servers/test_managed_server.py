"""A server the run starts itself (`server=NAME`, `harness/run/servers/managed.py`):
checked before any work, started on a free port and waited on, stopped after however the run
ends (its end, a server that fails, Ctrl-C, SIGTERM, the run killed), recorded in the run
directory; `servelab -m server=servelab server.strategy=A,B` measures each from a clean one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servelab.base.errors import ConfigError
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.harness.run.servers.managed import RECORD, ServerFailed
from servelab.harness.run.spec import run_spec

FAKE = [sys.executable, "-m", "servelab.harness.serving.fake_server", "--port", "'{port}'"]
FAKE_SERVER = ["server=command", f"server.command=[{','.join(FAKE)}]",
               "server.health_path=/v1/models"]  # fmt: skip
WORKLOAD = ["model=dummy-tiny", "workload=random", "workload.input_len.dist=fixed",
            "workload.input_len.value=8", "workload.output_len.value=3",
            "telemetry.roofline=false"]  # fmt: skip


def command(*argv: str) -> str:
    """A `server.command` override running `python ARGV... {port}`."""
    parts = [sys.executable, *(f'"{arg}"' for arg in argv), "'{port}'"]
    return f"server.command=[{','.join(parts)}]"


def gone(pid: int) -> bool:
    """Whether the process has exited (a zombie no one reaped has too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def wait_until(condition, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def test_the_server_node_is_checked_before_any_work() -> None:
    cases = {
        "server.kind": ["server=servelab", "server.kind=nope"],
        "server.strategy": ["server=servelab", "server.strategy=null"],
        "server.executable": ["server=vllm", "server.executable=/no/such/vllm"],
        "server.command": ["server=command"],
        "server.start_timeout_s": [*FAKE_SERVER, "server.start_timeout_s=0"],
        "server.health_path": [*FAKE_SERVER, "server.health_path=health"],
    }
    for field, overrides in cases.items():
        with pytest.raises(ConfigError, match=rf"^{field}:"):
            run_spec(compose(overrides))
    with pytest.raises(ConfigError, match=r"^server\.command: say where the port goes"):
        run_spec(compose(["server=command", f"server.command=[{sys.executable},-V]"]))
    with pytest.raises(ConfigError, match="not backend=inprocess"):
        run_spec(compose([*FAKE_SERVER, "backend=inprocess"]))
    hf_only = ["server=vllm", f"server.executable={sys.executable}", "model=dummy-tiny"]
    with pytest.raises(ConfigError, match=r"^server\.model: vllm loads a Hugging Face folder"):
        run_spec(compose(hf_only))


def test_servelab_s_server_gets_the_run_s_model_engine_and_strategy() -> None:
    spec = run_spec(
        compose(["server=servelab", "server.strategy=orca", "model=dummy-tiny",
                 "engine.dtype=fp32", "engine.cache_dir='~/a b'",
                 "server.flags=['engine.max_batch_size=4']"])
    )  # fmt: skip
    assert spec.backend == "openai" and spec.server is not None
    argv = spec.server.argv(1234)
    assert argv[:4] == [sys.executable, "-m", "servelab", "serve"]
    assert "serve.port=1234" in argv and "strategy=orca" in argv and "model=dummy-tiny" in argv
    assert "engine.dtype=fp32" in argv and "engine.cache_dir='~/a b'" in argv
    assert argv[-1] == "engine.max_batch_size=4"  # its flags last: they win
    assert spec.server.label == "servelab:orca engine.max_batch_size=4"
    assert run_spec(compose(WORKLOAD)).server is None  # no server group: none started
    vllm = run_spec(
        compose(
            [
                "server=vllm",
                f"server.executable={sys.executable}",
                "server.model=/models/x",
                "server.flags=[--max-num-seqs,8]",
                "server.same_budget=false",
            ]
        )
    )
    assert vllm.server is not None and vllm.server.argv(1234) == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/x",
        "--host", "127.0.0.1", "--port", "1234", "--enable-prompt-tokens-details",
        "--max-num-seqs", "8",
    ]  # fmt: skip


@pytest.mark.integration
def test_a_run_starts_measures_stops_and_records_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # a server's setting, recorded with it
    summary = run(compose([*FAKE_SERVER, *WORKLOAD, "workload.num_requests=20"]), tmp_path)
    assert summary["status"] == "complete" and summary["completed"] == 20
    record = json.loads((tmp_path / RECORD).read_text())
    assert record["kind"] == "command" and record["command"][-1].isdigit()
    assert record["url"].endswith(record["command"][-1]) and record["startup_s"] > 0
    assert record["exit_status"] is not None and gone(record["pid"])
    assert record["warmup_s"] > 0 and record["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "fake server: streaming" in (tmp_path / "server.log").read_text()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["strategy"]["name"] == record["label"]  # the report names the server


@pytest.mark.integration
def test_a_server_that_fails_gives_one_line_with_its_last_words_before_its_limit(
    tmp_path: Path,
) -> None:
    exits = ["server=command", "server.start_timeout_s=120",
             command("-c", "import sys; print('ValueError: no model here'); "
                     "[print('shutting down', i) for i in range(6)]; sys.exit(3)")]  # fmt: skip
    started = time.monotonic()
    cause = r"exited with status 3 .*its error: ValueError: no model here; .*shutting down 5$"
    with pytest.raises(ServerFailed, match=cause) as failed:
        run(compose([*exits, *WORKLOAD]), tmp_path / "exits")
    assert time.monotonic() - started < 120 and "\n" not in str(failed.value)
    silent = ["server=command", "server.start_timeout_s=2",
              command("-c", "import time; print('loading'); time.sleep(600)")]  # fmt: skip
    with pytest.raises(ServerFailed, match=r"did not answer /health within 2 s.*loading"):
        run(compose([*silent, *WORKLOAD]), tmp_path / "silent")
    assert gone(json.loads((tmp_path / "silent" / RECORD).read_text())["pid"])
    not_openai = ["server=command", "server.health_path=/", command("-m", "http.server")]
    with pytest.raises(ServerFailed, match=r"answered / but not its warm-up completion"):
        run(compose([*not_openai, *WORKLOAD]), tmp_path / "not_openai")
    assert gone(json.loads((tmp_path / "not_openai" / RECORD).read_text())["pid"])


def servelab_until_serving(run_dir: Path) -> tuple[subprocess.Popen, int]:
    """`servelab` (the command) measuring the fake server for minutes, once it answers."""
    overrides = [*FAKE_SERVER, *WORKLOAD, "workload.num_requests=400",
                 "workload.arrival.process=poisson", "workload.arrival.rate=2",
                 f"hydra.run.dir={run_dir}"]  # fmt: skip
    process = subprocess.Popen(  # Ctrl-C as at a terminal: a test worker may ignore SIGINT
        [sys.executable, "-m", "servelab", *overrides],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_until(lambda: "startup_s" in json.loads((run_dir / RECORD).read_text() or "{}")
               if (run_dir / RECORD).is_file() else False, 120)  # fmt: skip
    time.sleep(1.0)  # the run's clock has started
    return process, json.loads((run_dir / RECORD).read_text())["pid"]


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_server_is_left_behind_when_the_run_is_interrupted(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Ctrl-C (SIGINT) and SIGTERM end the run through its cleanup, which stops the server;
    a run killed outright leaves it to the kernel's parent-death signal."""
    process, pid = servelab_until_serving(tmp_path)
    assert not gone(pid)
    process.send_signal(sig)
    process.wait(60)
    wait_until(lambda: gone(pid), 30)
    if sig != signal.SIGKILL:
        assert json.loads((tmp_path / RECORD).read_text())["exit_status"] is not None


@pytest.mark.integration
def test_a_sweep_measures_each_strategy_from_its_own_servelab_server(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "servelab", "-m", "server=servelab",
         "server.strategy=orca,vllm", *WORKLOAD, "workload.num_requests=6",
         "engine.dtype=fp32", "engine.warmup=false", f"hydra.sweep.dir={sweep}"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/" + RECORD))]
    assert [r["label"] for r in records] == ["servelab:orca", "servelab:vllm"]
    assert len({r["pid"] for r in records}) == 2 and all(gone(r["pid"]) for r in records)
    assert all("strategy=" + r["strategy"] in r["command"] for r in records)
    assert "servelab:orca" in (sweep / "summary.csv").read_text()
