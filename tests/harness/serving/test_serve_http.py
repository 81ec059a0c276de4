"""`servelab serve` as a real subprocess on loopback, with the real model in fp32, measured by
`backend=openai` and spoken to by the official OpenAI client.

One server (vLLM strategy, an API key, a record directory) serves every test here: the same
outputs over HTTP as in process, TTFT over HTTP within the transport overhead measured
beside it, every bad request answered as OpenAI clients expect while others keep being
served, and a client that hangs up freeing its KV. The last check is a clean SIGINT.
"""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from servelab.base.errors import ConfigError
from servelab.base.records import RequestRecord
from servelab.harness.measure.rundir import read_requests, read_steps
from servelab.harness.run.compose import compose
from servelab.harness.run.run import run
from servelab.reports.grouping import group_runs
from servelab.reports.load import load_run
from tests.server_process import ServerProcess, start_server

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m"
KEY_ENV = "SERVELAB_TEST_API_KEY"
KEY = "sk-test-" + secrets.token_hex(12)
COMMON = ["engine.dtype=fp32", "strategy=vllm", "engine.kv_budget=64MiB"]
PROMPT = [504, 3458, 282, 4649, 314, 253, 1345, 30, 378, 4649, 314, 2373, 284, 8137, 30]
VALID = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The client side, and the in-process run, on one thread: on a shared 2-core machine two
    spinning threads per process can make a step many times slower (the server too, below)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    record = tmp_path_factory.mktemp("served")
    overrides = [*COMMON, f"serve.api_key_env={KEY_ENV}", f"serve.record_dir={record}"]
    server = start_server(overrides, env={KEY_ENV: KEY, "OMP_NUM_THREADS": "1"})
    yield server, record
    assert server.stop(signal.SIGINT) == 0, "".join(server.output)
    assert "servelab: stopped" in "".join(server.output)


@pytest.fixture
def http(served: tuple[ServerProcess, Path]) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=served[0].url, headers=headers, timeout=120) as client:
        yield client


def endpoint_of(server: ServerProcess) -> list[str]:
    """The overrides that measure `server` through backend=openai, with the test's key."""
    return ["backend=openai", f"endpoint.url={server.url}", f"endpoint.api_key_env={KEY_ENV}"]


def metrics(http: httpx.Client) -> dict[str, float]:
    """Every sample of /metrics by name (labels appended as name{value})."""
    text = http.get("/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = ",".join(sample.labels.values())
            samples[sample.name + (f"{{{label}}}" if label else "")] = sample.value
    return samples


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 60.0, server: ServerProcess | None = None
) -> None:
    """Until `condition` holds; past `timeout_s` fail, with the end of `server`'s output."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        said = "" if server is None else "".join(server.output[-40:])
        assert time.monotonic() < deadline, f"condition not met in time; the server said:\n{said}"
        time.sleep(0.05)


def served_records(record_dir: Path) -> dict[str, RequestRecord]:
    return {r.id: r for r in read_requests(record_dir)}


def test_models_health_and_metrics(http: httpx.Client) -> None:
    models = http.get("/v1/models").json()
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [(MODEL, 8192)]
    assert http.get("/health").json() == {"status": "ok"}
    values = metrics(http)
    assert values["servelab_kv_slots_total"] == 64 * 2**20 // (30 * 3 * 64 * 2 * 4) // 16 * 16
    for name in ("servelab_requests_running", "servelab_requests_waiting", "servelab_kv_usage"):
        assert name in values


def test_official_client_completions_chat_and_streams(served: tuple[ServerProcess, Path]) -> None:
    client = openai.OpenAI(base_url=f"{served[0].url}/v1", api_key=KEY)
    extra = {"return_token_ids": True, "ignore_eos": True}
    whole = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, extra_body=extra
    )
    assert whole.usage.prompt_tokens == len(PROMPT) and whole.usage.completion_tokens == 6
    ids = whole.choices[0].model_extra["token_ids"]
    assert len(ids) == 6 and whole.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        stream=True,
        extra_body=extra,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
    assert streamed == ids
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=5,
        temperature=0,
        stream=True,
    )
    pieces = list(chat)
    assert pieces[0].choices[0].delta.role == "assistant"
    assert pieces[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(p.choices[0].delta.content or "" for p in pieces).strip()


def test_official_client_n_choices_one_per_sample(served: tuple[ServerProcess, Path]) -> None:
    """n = 3: three choices, indexed, the prompt counted once and every sample's tokens in
    the usage; the first sample is what a single request with the same seed draws."""
    client = openai.OpenAI(base_url=f"{served[0].url}/v1", api_key=KEY)
    extra = {"return_token_ids": True, "ignore_eos": True}
    asked = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=1.5, seed=11)
    three = client.completions.create(**asked, n=3, extra_body=extra)
    assert [c.index for c in three.choices] == [0, 1, 2]
    samples = [c.model_extra["token_ids"] for c in three.choices]
    assert [len(ids) for ids in samples] == [5, 5, 5]
    assert len({tuple(ids) for ids in samples}) > 1
    assert three.usage.prompt_tokens == len(PROMPT) and three.usage.completion_tokens == 15
    one = client.completions.create(**asked, extra_body=extra)
    assert one.choices[0].model_extra["token_ids"] == samples[0]
    ids = {three.id, f"{three.id}#1", f"{three.id}#2"}
    wait_for(lambda: ids <= served_records(served[1]).keys())
    assert served_records(served[1])[f"{three.id}#2"].sample_index == 2


BAD_REQUESTS = [
    # (what, body, status, param, code)
    ("malformed JSON", b'{"model": "smollm2-135m", "prompt": [1,', 400, None, "json_invalid"),
    ("unknown model", {**VALID, "model": "gpt-9"}, 404, "model", "model_not_found"),
    (
        "prompt longer than the context",
        {**VALID, "prompt": [1] * 8192},
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "prompt + max_tokens past the context",
        {**VALID, "prompt": [1] * 8000, "max_tokens": 500},
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    ("more KV than the whole cache", {**VALID, "prompt": [1] * 2000}, 400, "max_tokens", None),
    ("negative temperature", {**VALID, "temperature": -0.5}, 400, "temperature", None),
    ("temperature above 2", {**VALID, "temperature": 2.5}, 400, "temperature", None),
    ("top_p of 0", {**VALID, "top_p": 0}, 400, "top_p", None),
    ("max_tokens 0", {**VALID, "max_tokens": 0}, 400, "max_tokens", None),
    ("max_tokens not a number", {**VALID, "max_tokens": "many"}, 400, "max_tokens", None),
    ("token id outside the vocabulary", {**VALID, "prompt": [1, 49152]}, 400, "prompt", None),
    ("empty prompt", {**VALID, "prompt": ""}, 400, "prompt", None),
    ("no prompt", {"model": MODEL}, 400, "prompt", None),
    ("two choices in a stream", {**VALID, "n": 2, "stream": True}, 400, "n", None),
    ("stop strings", {**VALID, "stop": ["\n"]}, 400, "stop", None),
]


def _post(http: httpx.Client, body: dict | bytes, path: str = "/v1/completions") -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        return http.post(path, content=body, headers=headers)
    return http.post(path, json=body)


@pytest.mark.parametrize(("what", "body", "status", "param", "code"), BAD_REQUESTS)
def test_bad_request_gets_the_openai_error(
    http: httpx.Client,
    what: str,
    body: dict | bytes,
    status: int,
    param: str | None,
    code: str | None,
) -> None:
    response = _post(http, body)
    error = response.json()["error"]
    assert (response.status_code, error["type"], error["param"], error["code"]) == (
        status,
        "invalid_request_error",
        param,
        code,
    ), what
    assert error["message"]


def test_bad_chat_requests_and_keys(served: tuple[ServerProcess, Path], http: httpx.Client) -> None:
    empty = _post(http, {"model": MODEL, "messages": []}, "/v1/chat/completions")
    assert (empty.status_code, empty.json()["error"]["param"]) == (400, "messages")
    role = {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}
    assert _post(http, role, "/v1/chat/completions").json()["error"]["param"] == "messages"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.post(f"{served[0].url}/v1/completions", json=VALID, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_official_client_raises_its_typed_errors(served: tuple[ServerProcess, Path]) -> None:
    client = openai.OpenAI(base_url=f"{served[0].url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt=[1] * 8192, max_tokens=4)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="wrong", max_retries=0).models.list()


def test_bad_requests_leave_a_stream_in_flight_untouched(http: httpx.Client) -> None:
    body = {**VALID, "max_tokens": 12, "ignore_eos": True, "return_token_ids": True}
    alone = http.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]
    streamed: list[int] = []
    started = threading.Event()

    def read_stream() -> None:
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                data = line.removeprefix("data: ")
                if line.startswith("data: ") and data != "[DONE]":
                    streamed.extend(json.loads(data)["choices"][0]["token_ids"])
                    started.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert started.wait(60)
    for _, bad, status, _, _ in BAD_REQUESTS:
        assert _post(http, bad).status_code == status
    reader.join(120)
    assert streamed == alone


def _cancelled(http: httpx.Client) -> float:
    return metrics(http).get("servelab_requests_finished_total{cancelled}", 0.0)


def _assert_pool_full(http: httpx.Client, before: float) -> None:
    wait_for(lambda: _cancelled(http) == before + 1)
    values = metrics(http)
    assert values["servelab_kv_slots_allocated"] == 0
    assert (values["servelab_requests_running"], values["servelab_requests_waiting"]) == (0, 0)


def test_client_gone_mid_stream_frees_its_kv(
    served: tuple[ServerProcess, Path], http: httpx.Client
) -> None:
    idle = ("servelab_requests_running", "servelab_requests_waiting", "servelab_kv_slots_allocated")
    # the server idle first: a request an earlier test left running would share the KV budget
    # this request needs nearly all of, and could preempt it or be preempted
    wait_for(lambda: not any(metrics(http)[name] for name in idle), 60.0, served[0])
    before = _cancelled(http)
    # as long as the KV budget holds (1,456 slots): a loaded machine can starve this client
    # while the server streams, and 400 tokens were once all sent before it read three
    body = {**VALID, "max_tokens": 1400, "ignore_eos": True, "stream": True}
    headers = {"X-Request-Id": "gone-mid-stream"}
    with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        chunks = []
        # held open: a line iterator left to the garbage collector closes the response, and
        # the client leaves at the `break` rather than at the end of the block; the server then
        # cancels the request within a step, often before the wait below first asks
        lines = response.iter_lines()
        for line in lines:
            chunks += [line] if line.startswith("data: ") else []
            if len(chunks) == 3:
                break
        assert len(chunks) == 3 and "error" not in chunks[-1], chunks
        # the gauges are the snapshot the engine loop publishes after it hands a step's tokens
        # to the streams, so a fast reader can ask before it is published: wait for it
        wait_for(lambda: metrics(http)["servelab_kv_slots_allocated"] > 0, 30.0, served[0])
        assert metrics(http)["servelab_requests_running"] == 1  # still served, mid-stream
    _assert_pool_full(http, before)
    record = served_records(served[1])["gone-mid-stream"]
    assert record.finish_reason == "cancelled" and 3 <= record.output_len < 1400


def test_client_gone_before_a_whole_response_frees_its_kv(
    served: tuple[ServerProcess, Path], http: httpx.Client
) -> None:
    before = _cancelled(http)
    body = {**VALID, "max_tokens": 400, "ignore_eos": True}
    headers = {"X-Request-Id": "gone-waiting", "Authorization": f"Bearer {KEY}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{served[0].url}/v1/completions", json=body, headers=headers, timeout=2.0)
    _assert_pool_full(http, before)
    assert served_records(served[1])["gone-waiting"].finish_reason == "cancelled"


class Pinger(threading.Thread):
    """Round trips of GET /health while a run goes on: the transport's cost under that load."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rtts: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url) as client:
            while not self.done.wait(0.01):
                start = time.perf_counter()
                client.get("/health")
                self.rtts.append(time.perf_counter() - start)


def test_over_http_the_same_tokens_and_ttft_within_the_transport_overhead(
    served: tuple[ServerProcess, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One workload in process, then through `backend=openai` against the server (same
    strategy, fp32): token for token the same outputs. Each request's TTFT over HTTP is
    compared with the TTFT the server's engine recorded for that very request (its in-process
    measurement: the same steps, so compute time and batching cancel out). The difference,
    the client's lateness plus the way there and the first chunk's way back, is never
    negative and never more than the request's send lag plus the longest round trip that
    GET /health took on this transport while the run went on."""
    server, record_dir = served
    workload = ["workload=smoke", "workload.arrival.process=constant", "workload.arrival.rate=8"]
    common = [*COMMON, *workload, "telemetry.roofline=false"]
    run(compose(common), tmp_path / "inprocess", progress=False)
    monkeypatch.setenv(KEY_ENV, KEY)
    pinger = Pinger(server.url)
    pinger.start()
    scraped = [*endpoint_of(server), "endpoint.metrics_period_s=0.2"]
    summary = run(compose([*common, *scraped]), tmp_path / "http", progress=False)
    pinger.done.set()
    pinger.join()
    assert summary["status"] == "complete" and summary["completed"] == 8
    assert summary["strategy"] == {"name": f"openai:{MODEL}", "backend": "openai", "model": MODEL}
    local = {r.id: r for r in read_requests(tmp_path / "inprocess")}
    remote = {r.id: r for r in read_requests(tmp_path / "http")}
    engine_side = served_records(record_dir)
    transport = max(pinger.rtts)
    assert sorted(remote) == sorted(local)
    for rid, got in remote.items():
        assert got.output_ids == local[rid].output_ids == engine_side[rid].output_ids, rid
        assert got.finish_reason == "length" and len(got.token_times) == got.output_len == 16
        assert got.counters["token_times_from"] == "token_ids"
        ttft_http = got.token_times[0] - got.t_scheduled
        served_side = engine_side[rid]
        ttft_engine = served_side.token_times[0] - served_side.t_scheduled
        lag = got.t_send - got.t_scheduled
        assert 0 <= ttft_http - ttft_engine <= lag + transport, (rid, ttft_http, ttft_engine)
    computed = [s for s in read_steps(record_dir) if s.num_seqs > 0]
    assert computed and all(  # the server's steps carry the roofline counters a run's do
        {"flops", "bytes", "mfu", "mbu"} <= set(s.counters) and s.counters["flops"] > 0
        for s in computed
    )
    (group,) = group_runs([load_run(tmp_path / "inprocess"), load_run(tmp_path / "http")])
    assert group.labels == [f"openai:{MODEL}", "vllm"]  # one comparison, side by side
    meta = json.loads((tmp_path / "http" / "meta.json").read_text())
    assert (meta["backend"]["url"], meta["backend"]["server_models"]) == (server.url, [MODEL])
    assert meta["backend"]["api_key_env"] == KEY_ENV
    assert meta["backend"]["server_metrics"]["source"] == "servelab"  # its /metrics, scraped
    scrape = summary["server_metrics"]
    assert scrape["samples"] >= 3 and scrape["failed"] == 0
    assert summary["peak_running"] is None  # no engine step seen here: the server's, below
    assert 0 <= scrape["kv_usage_share_max"] <= 1 and scrape["waiting_requests_max"] >= 0
    assert load_run(tmp_path / "http").server_metrics["running_requests"].notna().all()
    for path in (tmp_path / "http").rglob("*"):
        assert not path.is_file() or KEY not in path.read_text(errors="replace"), path


def test_endpoint_checks_model_and_key_before_any_work(
    served: tuple[ServerProcess, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = endpoint_of(served[0])
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(ConfigError, match=r"endpoint.model: .* serves \['smollm2-135m'\], not"):
        run(compose([*endpoint, "endpoint.model=gpt-9"]), tmp_path / "model", progress=False)
    monkeypatch.setenv(KEY_ENV, "sk-wrong")
    with pytest.raises(ConfigError, match=r"endpoint.api_key_env: .* refused the key \(HTTP 401\)"):
        run(compose(endpoint), tmp_path / "key", progress=False)
    assert not (tmp_path / "model").exists() and not (tmp_path / "key").exists()


def test_failed_requests_are_recorded_with_their_error(
    served: tuple[ServerProcess, Path], http: httpx.Client, tmp_path: Path, monkeypatch
) -> None:
    """A request the server refuses, and one past endpoint.timeout_s (whose KV the server then
    frees, its client gone), are recorded as failed with the reason; the run completes."""
    monkeypatch.setenv(KEY_ENV, KEY)
    endpoint = endpoint_of(served[0])
    common = [*COMMON, "workload=smoke", "workload.num_requests=2", "telemetry.roofline=false"]
    refused = run(
        compose([*common, *endpoint, "+endpoint.extra_body.n=2"]), tmp_path / "n", progress=False
    )
    assert (refused["status"], refused["failed"]) == ("complete", 2)
    errors = {r.error for r in read_requests(tmp_path / "n")}
    assert errors == {"HTTP 400: a stream carries one choice: send n > 1 without stream"}
    before = _cancelled(http)
    late = run(
        compose([*common, *endpoint, "endpoint.timeout_s=0.05"]), tmp_path / "late", progress=False
    )
    assert late["failed"] == 2 and "2 requests failed or were rejected" in late["flags"]
    records = read_requests(tmp_path / "late")
    assert {r.error for r in records} == {"no complete response within endpoint.timeout_s=0.05"}
    assert all(r.finish_reason == "error" and r.t_done is not None for r in records)
    wait_for(lambda: _cancelled(http) == before + 2)
    assert metrics(http)["servelab_kv_slots_allocated"] == 0


def test_a_repeat_served_from_the_warm_prefix_cache_is_flagged_and_a_busted_one_is_cold(
    served: tuple[ServerProcess, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same seeded workload twice against the server (prefix caching on): the first run
    fills the cache, the repeat finds its prompts there, from a cache it did not fill, and is
    flagged; with workload.cache_bust=true the repeat's prompts are new to the cache again."""
    server, _ = served
    monkeypatch.setenv(KEY_ENV, KEY)
    workload = [
        "workload=random", "workload.seed=4242", "workload.num_requests=6",
        "workload.input_len.dist=fixed", "workload.input_len.value=48",
        "workload.output_len.value=4",
        "workload.arrival.process=constant", "workload.arrival.rate=4",
    ]  # fmt: skip
    common = [*COMMON, *workload, *endpoint_of(server), "telemetry.roofline=false"]

    def measured(name: str, *extra: str) -> dict:
        return run(compose([*common, *extra]), tmp_path / name, progress=False)

    first, repeat = measured("first"), measured("repeat")
    assert first["warm_cache_share"] == 0 and "warm_prefix_cache" not in first["flag_codes"]
    assert repeat["warm_cache_share"] > 0.5 and "warm_prefix_cache" in repeat["flag_codes"]
    assert repeat["cached_prompt_share"] == repeat["warm_cache_share"]  # the prompts share none
    records = read_requests(tmp_path / "repeat")
    assert all(r.counters["cached_tokens_from"] == "usage" for r in records)
    assert all(r.cached_prompt_tokens == 32 for r in records)  # whole 16-token blocks
    busted = measured("busted", "workload.cache_bust=true")
    assert busted["warm_cache_share"] == 0 and "warm_prefix_cache" not in busted["flag_codes"]
    config = (tmp_path / "busted" / "config.yaml").read_text()
    assert "cache_bust: true" not in config and "cache_bust: " in config  # its nonce recorded
