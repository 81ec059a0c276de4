"""A search over contenders of every kind (`harness/search/contenders.py`, `served.py`): items
checked before any run; each server started once for all its probes, off the budget's clock,
and stopped after its last; every probe cold on its own nonce; a server that dies or never
answers ends its contender alone; SIGTERM and Ctrl-C of the search leave no server behind."""

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
from servelab.harness.search.contenders import contenders_of, overrides_of, reference_of
from servelab.harness.search.knee_search import search
from servelab.harness.search.probes import Probe
from servelab.harness.search.served import SERVER
from tests.harness.run.servers.test_managed_server import gone, wait_until

FAKE = ("server=command server.command=[" + sys.executable
        + ",-m,servelab.harness.serving.fake_server,--port,'{port}'] "
        "server.health_path=/v1/models endpoint.label=fake")  # fmt: skip
SILENT = ("server=command server.start_timeout_s=2 server.command=[" + sys.executable
          + ",-c,'import time; time.sleep(600)','{port}'] endpoint.label=silent")  # fmt: skip
BASE = ["model=dummy-tiny", "engine.device=cpu", "engine.dtype=fp32", "telemetry.roofline=false",
        "workload=random", "workload.input_len.dist=fixed", "workload.input_len.value=8",
        "workload.output_len.value=3", "slo.ttft_s=1", "search.predict=false",
        "search.budget_s=12"]  # fmt: skip


def strategies(*items: str) -> str:
    return "search.strategies=[" + ",".join(f'"{item}"' for item in items) + "]"


def test_an_item_is_a_preset_or_overrides() -> None:
    assert overrides_of("orca-chunked") == ["strategy=orca-chunked"]
    assert overrides_of("server=vllm server.flags=[--max-num-seqs,8] endpoint.label='a b'") == [
        "server=vllm", "server.flags=[--max-num-seqs,8]", "endpoint.label='a b'",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="neither a strategy preset nor overrides"):
        overrides_of("server vllm")


def test_every_contender_is_checked_and_named_before_any_run() -> None:
    contenders = contenders_of(
        ("vllm", "server=servelab server.strategy=orca", FAKE), BASE, compose
    )
    assert [c.name for c in contenders] == ["vllm", "servelab:orca", "fake"]
    assert [c.server is None for c in contenders] == [True, False, False]
    assert contenders[1].folder == "servelab_orca" and contenders[0].in_process
    assert not contenders[2].in_process
    with pytest.raises(ConfigError, match=r"server.executable: .*contender 'server=llamacpp"):
        contenders_of(("vllm", "server=llamacpp server.executable=/no/such"), BASE, compose)
    with pytest.raises(ConfigError, match="two contenders are named 'vllm'"):
        contenders_of(("vllm", "strategy=orca endpoint.label=vllm backend=openai"), BASE, compose)
    with pytest.raises(ConfigError, match=r"^search.strategies: 'server.command=\[a': "):
        contenders_of(("server.command=[a",), BASE, compose)


def test_the_reference_contender_is_named_or_the_first() -> None:
    contenders = contenders_of(("vllm", FAKE), BASE, compose)
    assert reference_of(contenders, None).name == "vllm"
    assert reference_of(contenders, "fake").name == reference_of(contenders, FAKE).name == "fake"
    with pytest.raises(ConfigError, match="search.reference: 'orca' is none of the contenders"):
        reference_of(contenders, "orca")
    assert contenders[1].cfg.replay.skip_idle is False  # a server's clock is the machine's
    skipping = contenders_of(("vllm", FAKE), [*BASE, "replay.skip_idle=true"], compose)
    assert [c.cfg.replay.skip_idle for c in skipping] == [True, False]


def _search(tmp_path: Path, *items: str, seen=lambda s, p: None, say=lambda line: None):  # noqa: ANN001, ANN202
    overrides = [*BASE, strategies(*items), f"search.out_dir={tmp_path}"]
    return search(
        overrides, compose, lambda cfg, d: run(cfg, d, progress=False), say=say, seen=seen
    )


def _server_record(out_dir: Path, folder: str) -> dict:
    return json.loads((out_dir / folder / SERVER / "server.json").read_text())


@pytest.mark.integration
def test_a_server_serves_every_probe_of_its_contender_cold_and_is_stopped(tmp_path: Path) -> None:
    lines: list[str] = []
    result = _search(tmp_path, "vllm", FAKE, say=lines.append)
    shared = [line for line in lines if line.startswith("note: fake serve on this machine's")]
    assert shared and "beside the client sending their requests" in shared[0]  # on a CPU
    inprocess, fake = result.knees
    assert len(fake.probes) >= 3 and fake.low is not None and inprocess.low is not None
    nonces = [p.outcome.cache_nonce for p in fake.probes]
    assert len(set(nonces)) == len(nonces) and None not in nonces  # one nonce a probe
    assert all(p.outcome.cache_nonce is None for p in inprocess.probes)  # a new engine each
    server = _server_record(tmp_path, "fake")
    assert gone(server["pid"]) and server["exit_status"] is not None
    assert len(list(tmp_path.glob(f"*/{SERVER}/server.json"))) == 1  # started once
    record = json.loads((tmp_path / "search.json").read_text())
    assert list(record["servers"]["started_s"]) == ["fake"]
    assert record["servers"]["off_budget_s"] >= record["servers"]["started_s"]["fake"] > 0
    assert [c["folder"] for c in record["contenders"]] == ["vllm", "fake"]
    probes = record["knees"][1]["probes"]
    assert [p["cache_nonce"] for p in probes] == nonces
    configs = [json.loads((Path(p["run_dir"]) / "meta.json").read_text())["config"]
               for p in probes]  # fmt: skip
    assert {c["endpoint"]["url"] for c in configs} == {server["url"]}  # one server for all
    assert [c["workload"]["cache_bust"] for c in configs] == nonces


@pytest.mark.integration
def test_a_server_killed_mid_search_ends_its_contender_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    def kill_after_ceiling(strategy: str, probe: Probe) -> None:
        if strategy == "fake" and probe.spec.kind == "ceiling":
            os.kill(_server_record(tmp_path, "fake")["pid"], signal.SIGKILL)

    result = _search(tmp_path, FAKE, "vllm", SILENT, seen=kill_after_ceiling)
    fake, inprocess, silent = result.knees
    assert fake.gone and "its server exited (status -9) by rate-" in fake.note
    assert "its knee from the 0 rate probes before" in fake.note and not fake.rate_probes
    assert silent.gone and "did not answer /health within 2 s" in silent.note
    assert not inprocess.gone and inprocess.rate_probes and inprocess.low is not None
    for folder in ("fake", "silent"):
        assert gone(_server_record(tmp_path, folder)["pid"])


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_no_server_is_left_behind_when_the_search_is_interrupted(
    tmp_path: Path, sig: signal.Signals
) -> None:
    overrides = [*BASE, "search.budget_s=600", strategies(FAKE), f"search.out_dir={tmp_path}"]
    process = subprocess.Popen(  # Ctrl-C as at a terminal: a test worker may ignore SIGINT
        [sys.executable, "-m", "servelab", "search", *overrides],
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    record = tmp_path / "fake" / SERVER / "server.json"
    wait_until(lambda: record.is_file() and "startup_s" in json.loads(record.read_text()), 120)
    time.sleep(1.0)  # probes under way
    pid = json.loads(record.read_text())["pid"]
    process.send_signal(sig)
    process.wait(60)
    wait_until(lambda: gone(pid), 30)
    assert json.loads(record.read_text())["exit_status"] is not None


@pytest.mark.integration
def test_a_prefix_caching_server_finds_no_probe_s_prompts_in_its_cache(tmp_path: Path) -> None:
    """servelab's own server with paged KV and prefix caching (`vllm`): each probe's prompts
    are new to it, as its own count of cached prompt tokens says."""
    result = _search(tmp_path, "server=servelab server.strategy=vllm")
    (served,) = result.knees
    assert len(served.probes) >= 3
    assert all(p.outcome.warm_cache_share == 0 for p in served.probes)
